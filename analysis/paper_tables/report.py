"""Where paper tables and figures go: md/csv/tex tables and PNG/PDF figures that name their sources, a list
of what was skipped and why, an index (``README.md``, ``manifest.json``), and one W&B analysis run."""

from __future__ import annotations

import csv
import io
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eval.compare import markdown
from zoomr.rundir import replace_file, write_text_atomic


def tex(header: list[str], rows: list[list[str]], caption: str) -> str:
    """A booktabs ``tabular`` of the cells (LaTeX special characters escaped)."""

    def esc(x: str) -> str:
        for a, b in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"), ("#", r"\#"),
                     ("Δ", r"$\Delta$"), ("²", r"$^2$"), ("±", r"$\pm$"), ("÷", r"$\div$"), ("—", "--")):  # fmt: skip
            x = x.replace(a, b)
        return x

    lines = [
        r"\begin{table}[t]",
        r"\centering",
        r"\begin{tabular}{l" + "r" * (len(header) - 1) + "}",
        r"\toprule",
        " & ".join(esc(h) for h in header) + r" \\",
        r"\midrule",
        *(" & ".join(esc(str(c)) for c in r) + r" \\" for r in rows),
        r"\bottomrule",
        r"\end{tabular}",
        r"\caption{" + esc(caption) + "}",
        r"\end{table}",
    ]
    return "\n".join(lines) + "\n"


def describe_sources(sources: list[str], limit: int = 4) -> str:
    shown = ", ".join(sources[:limit])
    return shown + (f" (+{len(sources) - limit} more)" if len(sources) > limit else "")


INDEX_FILES = ("README.md", "manifest.json")
WRITING = ".paper_tables_writing.json"  # while a run rewrites the directory: the files earlier runs and it wrote


def _owned_files(out: Path) -> set[str]:
    """The table and figure files earlier runs wrote in ``out``: those its index lists, and those a run cut short
    recorded in :data:`WRITING`. Only plain names of files in ``out`` (an unreadable or edited index: none)."""
    names: set[str] = set()
    for record in (out / "manifest.json", out / WRITING):
        try:
            data = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        items = [x for kind in ("tables", "figures") if isinstance(data.get(kind), list) for x in data[kind]]
        lists = [x.get("files") for x in items if isinstance(x, dict)] + [data.get("files")]
        listed = [f for files in lists if isinstance(files, list) for f in files]
        names |= {f for f in listed if isinstance(f, str) and f and f == Path(f).name and not f.startswith(".")}
    return names - set(INDEX_FILES)


@dataclass
class Report:
    out: Path
    tables: list[dict[str, Any]] = field(default_factory=list)
    figures: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    writing: bool = False  # the previous run's index is gone: this run has started rewriting its files
    earlier: set[str] = field(default_factory=set)  # files earlier runs wrote here (removed if this run does not)
    removed: list[str] = field(default_factory=list)  # those removed by write_index

    def __post_init__(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        self.earlier = _owned_files(self.out)

    def _written(self) -> list[str]:
        return [f for item in (*self.tables, *self.figures) for f in item["files"]]

    def start_writing(self, files: list[str]) -> None:
        """Before each table or figure: record the files earlier runs and this one wrote (so that a run after this
        one, if it is cut short, still knows them), and before the first remove a previous run's index, which would
        otherwise describe a directory this run, if cut short, left half rewritten (the index is written again
        last, by :meth:`write_index`)."""
        write_text_atomic(self.out / WRITING, json.dumps({"files": sorted(self.earlier | {*self._written(), *files})}))
        if not self.writing:
            for name in INDEX_FILES:
                (self.out / name).unlink(missing_ok=True)
            self.writing = True

    def table(self, key: str, title: str, header: list[str], rows: list[list[Any]], sources: list[str],
              fed_by: str, note: str = "") -> None:  # fmt: skip
        """Write ``<key>.md/.csv/.tex``; the md and tex say which runs and how many problems/samples fed it."""
        cells = [[str(c) for c in r] for r in rows]
        provenance = f"Inputs: {fed_by}. Runs: {', '.join(sources)}."
        md = f"### {title}\n\n{markdown(header, cells)}\n\n{provenance}" + (f"\n\n{note}" if note else "")
        rows_csv = io.StringIO()
        csv.writer(rows_csv).writerows([header, *cells])
        self.start_writing([f"{key}.{ext}" for ext in ("md", "csv", "tex")])
        write_text_atomic(self.out / f"{key}.md", md + "\n")
        write_text_atomic(self.out / f"{key}.csv", rows_csv.getvalue(), newline="")
        write_text_atomic(self.out / f"{key}.tex", tex(header, cells, f"{title}. {fed_by}."))
        self.tables.append(
            {"key": key, "title": title, "header": header, "rows": cells, "sources": sources, "fed_by": fed_by,
             "files": [f"{key}.{ext}" for ext in ("md", "csv", "tex")]}  # fmt: skip
        )

    def figure(self, key: str, fig: Any, title: str, sources: list[str], fed_by: str) -> None:
        """Save ``<key>.png`` and ``<key>.pdf`` with a footer naming the source runs."""
        import matplotlib.pyplot as plt

        fig.suptitle(title, fontsize=10)
        fig.text(0.01, 0.005, f"{fed_by}; source: {describe_sources(sources)}", fontsize=6, color="0.35",
                 ha="left", va="bottom", wrap=True)  # fmt: skip
        fig.tight_layout(rect=(0, 0.05, 1, 0.95))
        self.start_writing([f"{key}.png", f"{key}.pdf"])
        for ext in ("png", "pdf"):
            replace_file(self.out / f"{key}.{ext}", lambda tmp, ext=ext: fig.savefig(tmp, dpi=130, format=ext))
        plt.close(fig)
        self.figures.append(
            {"key": key, "title": title, "sources": sources, "fed_by": fed_by, "files": [f"{key}.png", f"{key}.pdf"]}
        )

    def skip(self, key: str, reason: str) -> None:
        self.skipped.append({"key": key, "reason": reason})

    def remove_stale(self) -> None:
        """Remove the tables and figures an earlier run wrote here that this run did not make (skipped now: their
        inputs are gone), which a reader took for this run's beside its index; no other file is touched."""
        made = set(self._written())
        for name in sorted(self.earlier - made):
            if (self.out / name).is_file():
                (self.out / name).unlink()
                self.removed.append(name)

    def write_index(self, inputs_summary: dict[str, Any]) -> str:
        """``README.md`` (what was made, what was skipped and why, unusable inputs) and ``manifest.json``; the files
        of an earlier run that this one did not make are removed first (:meth:`remove_stale`)."""
        self.remove_stale()
        lines = [f"# Paper tables and figures ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})", ""]
        lines += ["## Tables", ""] + [f"- [{t['title']}]({t['key']}.md) — {t['fed_by']}" for t in self.tables]
        lines += ["", "## Figures", ""] + [f"- [{f['title']}]({f['key']}.png) — {f['fed_by']}" for f in self.figures]
        lines += ["", "## Skipped (inputs absent)", ""]
        lines += [f"- `{s['key']}`: {s['reason']}" for s in self.skipped] or ["- none"]
        lines += ["", "## Inputs", ""] + [f"- {k}: {v}" for k, v in inputs_summary["counts"].items()]
        if inputs_summary["problems"]:
            lines += ["", "### Inputs that could not be used", ""] + [f"- {p}" for p in inputs_summary["problems"]]
        if inputs_summary["unused"]:
            lines += ["", "### Inputs no table reads", ""] + [f"- {p}" for p in inputs_summary["unused"]]
        if self.removed:
            lines += ["", "## Removed (an earlier run's tables and figures this run did not make)", ""]
            lines += [f"- {name}" for name in self.removed]
        text = "\n".join(lines) + "\n"
        manifest = {"tables": self.tables, "figures": self.figures, "skipped": self.skipped, "inputs": inputs_summary}
        if self.removed:
            manifest["removed"] = self.removed
        write_text_atomic(self.out / "manifest.json", json.dumps(manifest, indent=2))
        write_text_atomic(self.out / "README.md", text)
        (self.out / WRITING).unlink(missing_ok=True)
        return text

    def log_wandb(self, logger: Any) -> None:
        """Each table as a ``wandb.Table``, each figure as an image, the skip list as a table (one run)."""
        for t in self.tables:
            logger.table(f"table/{t['key']}", t["header"], t["rows"])
        for f in self.figures:
            logger.image(f"figure/{f['key']}", self.out / f"{f['key']}.png")
        logger.table("skipped", ["key", "reason"], [[s["key"], s["reason"]] for s in self.skipped])
        logger.summary({"tables": len(self.tables), "figures": len(self.figures), "skipped": len(self.skipped)})
