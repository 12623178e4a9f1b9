"""Slim, self-contained copies of run directories: what ``paper_tables`` reads, small enough to commit (issue 16).

    python -m analysis.slim_runs runs/miniature/arms runs/train/mini-kvzap-T1024 \\
        --out analysis/results/miniature/runs

An evaluation run (``config.json`` + ``results.jsonl``) keeps its small JSON files and its rows without the
per-row text fields (``text``, ``gold``, ``extracted``) and the per-fact ``recall`` lists (a 256-problem
testbed arm goes from 2.5 MB to about 0.1 MB); every row keeps its scalars (``correct``, ``kv``,
``n_tokens``, ``recall_accuracy`` …) and gains ``"slim": true``. Its model is renamed to the model it is
compared within (:func:`analysis.paper_tables.inputs.base_model_name`, which follows checkpoints' training
runs up their ``init_from`` chain) and ``model.hf_id`` moves to ``model.evaluated_checkpoint``, so the copy
is grouped exactly like the original without the checkpoints being present. Other recognised inputs (KVzap
fits, allocation schedules) are copied whole; a bench JSON given as a source is copied with the eval runs it
names pointed at their copies. ``paper_tables`` over the copies regenerates the
same tables and figures as over the originals (tests/test_slim_runs.py).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zoomr.jsonl import BadRowError, JsonlReader, read_json, read_json_object
from zoomr.paths import output_dir

DROPPED = ("text", "gold", "extracted", "recall")  # large per-row fields no table reads
# problems.json: the problem ids of a RULER / LongBench run (eval.tasks.SCOPE_FILE), without which it cannot be read
KEPT_FILES = ("config.json", "fingerprint.json", "summary.json", "metrics.json", "schedule.json", "r2.json",
              "problems.json", "arm_command.json")  # fmt: skip


def slim_row(row: dict[str, Any]) -> dict[str, Any]:
    return {**{k: v for k, v in row.items() if k not in DROPPED}, "slim": True}


def map_strings(data: Any, fn: Callable[[str], str]) -> Any:
    """``data`` (nested dicts and lists of JSON) with ``fn`` applied to every string value."""
    if isinstance(data, dict):
        return {k: map_strings(v, fn) for k, v in data.items()}
    if isinstance(data, list):
        return [map_strings(v, fn) for v in data]
    return fn(data) if isinstance(data, str) else data


def relative(data: Any, root: str) -> Any:
    """``data`` with every string path under ``root`` made relative to it (no machine's paths in committed files)."""
    return map_strings(data, lambda v: v.replace(root, ""))


def slim_config(config: dict[str, Any]) -> dict[str, Any]:
    """The run's config with its model named as the model it is compared within and no checkpoint path to load."""
    from analysis.paper_tables.inputs import base_model_name

    model = dict(config.get("model") or {})
    if model.get("hf_id"):
        model["name"] = base_model_name(model)
        model["evaluated_checkpoint"] = model.pop("hf_id")
    return {**config, "model": model}


def evaluated_checkpoint(config: dict[str, Any]) -> str | None:
    """The checkpoint a slim copy's arm was evaluated on (``slim_config`` moved ``model.hf_id`` there); ``None`` for
    a config that still names its model in ``model.hf_id``."""
    model = config.get("model") or {}
    return None if model.get("hf_id") else model.get("evaluated_checkpoint")


def evaluated_config(config: dict[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`slim_config`: a slim copy's config loading the checkpoint it was evaluated on again."""
    ckpt = evaluated_checkpoint(config)
    if ckpt is None:
        return config
    model = {k: v for k, v in config["model"].items() if k != "evaluated_checkpoint"}
    return {**config, "model": {**model, "hf_id": ckpt}}


def slim_files(src: Path) -> dict[str, str]:
    """The text of every file of one run directory's copy (an eval run slimmed, anything else whole; paths under
    the working directory made relative), read in full first: a file that cannot be read is refused
    (:class:`BadRowError`) before any copy is written."""
    root = f"{Path.cwd()}/"
    files = {}
    for name in KEPT_FILES:
        if (src / name).is_file():
            if name == "config.json":
                data = read_json_object(src / name, "run config")
                if not isinstance(data.get("model") or {}, dict):
                    raise BadRowError(f"{src / name}: model is not an object (not a run config)")
                if (src / "results.jsonl").is_file():
                    data = slim_config(data)
            else:
                data = read_json(src / name, name)
            files[name] = json.dumps(relative(data, root), indent=1) + "\n"
    if (src / "results.jsonl").is_file():  # a copy of every row, so an unreadable one is refused, not dropped
        rows = [slim_row(row) for _, row in JsonlReader(src / "results.jsonl", on_bad="refuse")]
        files["results.jsonl"] = "".join(json.dumps(row) + "\n" for row in rows)
    return files


def write_copy(files: dict[str, str], dst: Path) -> int:
    """Write one run directory's copy (:func:`slim_files`); returns the bytes of the files in it. Every file is
    written to a temporary name first and then renamed, ``config.json`` (what makes a directory a run) last: a
    kill leaves the old copy whole (or, for a new one, no run directory), never a torn or emptied file beside
    whole ones."""
    dst.mkdir(parents=True, exist_ok=True)
    staged = []
    try:
        for name in sorted(files, key=lambda n: n == "config.json"):
            tmp = dst / f".{name}.{os.getpid()}.tmp"
            staged.append((tmp, dst / name))
            tmp.write_text(files[name])
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    for tmp, path in staged:
        os.replace(tmp, path)
    return sum(p.stat().st_size for p in dst.iterdir() if p.is_file())


def run_dirs(root: Path) -> list[Path]:
    """``root`` itself when it is a run directory, else the run directories below it (checkpoints pruned)."""
    from analysis.paper_tables.inputs import PRUNE

    def is_run(p: Path) -> bool:
        return (p / "config.json").is_file() and any(
            (p / f).is_file() for f in ("results.jsonl", "r2.json", "schedule.json")
        )

    if is_run(root):
        return [root]
    # pruned below root only: a source under a folder named like one (/scratch/final/runs) held "no run directory"
    return sorted(p for p in root.rglob("*") if p.is_dir() and not set(p.relative_to(root).parts) & PRUNE and is_run(p))


def slim_runs(sources: list[Path], out: Path) -> dict[str, int]:
    """Slim copies of every run directory under ``sources`` into ``out/<source name>/<relative path>``, plus
    bench JSON files given directly (the eval runs they name retargeted to the copies); returns bytes per copy."""
    missing = [str(s) for s in sources if not s.exists()]
    if missing:
        raise SystemExit(f"slim_runs: {', '.join(missing)} does not exist")
    plan: list[tuple[Path, Path]] = []  # (run directory, its copy relative to out)
    for src in [s for s in sources if s.is_dir()]:
        found = run_dirs(src)
        if not found:
            raise SystemExit(
                f"slim_runs: {src} holds no run directory (config.json with results.jsonl, r2.json or schedule.json)"
            )
        plan += [(run, Path(src.name) / run.relative_to(src)) for run in found]
    check_apart(sources, out, [(run, out / rel) for run, rel in plan])
    copied_to: dict[Path, Path] = {}
    for run, rel in plan:  # two folders of one name (runs/a/arms, runs/b/arms): the second copy replaced the first
        if copied_to.setdefault(rel, run).resolve() != run.resolve():
            raise SystemExit(f"slim_runs: {copied_to[rel]} and {run} would both be copied to {out / rel}; "
                             "copy sources of the same name to different --out folders")  # fmt: skip
    moved: dict[str, str] = {}  # each copied run directory, as a bench JSON may name it -> its copy
    for run, rel in plan:
        for name in {str(run), str(run.resolve()), os.path.relpath(run)}:
            moved[name] = str(out / rel)
    # everything read before anything is written: an unreadable source leaves no half-updated copy behind
    copies = [(rel, slim_files(run)) for run, rel in plan]
    benches = [(src.name, relative(retarget(read_json(src, "JSON file"), moved), f"{Path.cwd()}/"))
               for src in sources if src.is_file()]  # fmt: skip
    written = {str(rel): write_copy(files, out / rel) for rel, files in copies}
    for name, data in benches:
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, out / name)
        written[name] = (out / name).stat().st_size
    return written


def check_apart(sources: list[Path], out: Path, copies: list[tuple[Path, Path]]) -> None:
    """Refuse, before anything is written, an ``out`` that would write into what it copies: inside a source folder,
    or a copy landing on its own run directory or bench JSON (``--out`` = the sources' parent slimmed them in place,
    emptying their results)."""
    target = out.resolve()
    inside = [str(s) for s in sources if s.is_dir() and (target == s.resolve() or s.resolve() in target.parents)]
    onto = [str(run) for run, dst in copies if dst.resolve() == run.resolve()]
    onto += [str(f) for f in sources if f.is_file() and (out / f.name).resolve() == f.resolve()]
    if inside or onto:
        raise SystemExit(
            f"slim_runs: --out {out} would write into its sources ({', '.join(inside + onto)}); give a folder outside them"
        )


def retarget(data: Any, moved: dict[str, str]) -> Any:
    """``data`` with every string that names a copied run directory replaced by the copy's path."""
    return map_strings(data, lambda v: moved.get(v.rstrip("/"), v))


def main(argv: list[str] | None = None) -> dict[str, int]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "sources", nargs="+", type=Path, help="run directories, folders of them, or bench JSON files"
    )
    p.add_argument("--out", type=lambda v: Path(output_dir(v)), required=True)
    a = p.parse_args(argv)
    written = slim_runs(a.sources, a.out)
    for name, size in written.items():
        print(f"{size / 1024:8.1f} KiB  {name}")
    print(f"{len(written)} copies, {sum(written.values()) / 2**20:.1f} MiB -> {a.out}")
    return written


if __name__ == "__main__":
    from zoomr.script import run_script

    run_script(main)
