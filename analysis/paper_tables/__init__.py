"""``python -m analysis +task=paper_tables task.runs=[...] task.out=DIR``: every paper's tables and figures.

Reads run directories (or globs, ``**`` recurses; :mod:`.inputs` lists what is recognised) and writes under
``out``: AbridgeKV Table 1 and Figures 3a-3d, 4a, 6 (:mod:`.abridge_paper`); ZoomR's main table, resident KV
vs the MS formula and the AG histogram (:mod:`.zoomr_paper`); KVzap Table 1, accuracy vs compression,
per-prompt compression and threshold vs fixed ratio (:mod:`.kvzap_paper`). Tables are md/csv/tex and name their
runs and problem/sample counts; figures are PNG + PDF with the source runs in a footer. ``README.md`` indexes
everything, lists what was skipped and why (an absent input is named, never silently dropped) and the inputs
that could not be used; ``manifest.json`` holds the same. With a W&B logger every table is a ``wandb.Table``
and every figure an image of one ``analysis`` run. Also ``python -m analysis.paper_tables RUN... --out DIR``.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

from zoomr.paths import output_dir
from zoomr.runlock import RunLock

from . import abridge_paper, kvzap_paper, zoomr_paper
from .inputs import Inputs, discover
from .report import Report


def inputs_summary(inputs: Inputs) -> dict[str, Any]:
    return {
        "counts": {
            "evaluation runs": len(inputs.evals),
            "abridge_allocate runs": len(inputs.allocations),
            "KVzap fits": len(inputs.kvzap_fits),
            "throughput benches": len(inputs.throughput),
            "ZoomR benches": len(inputs.zoomr_bench),
        },
        "problems": inputs.problems,
        "unused": inputs.unused,
    }


def build_all(runs: list[str], out: str | Path, memory_gib: float = 8.0, n_resamples: int = 2000,
              seed: int = 1234, logger_cfg: dict[str, Any] | None = None,
              allow_different_settings: bool = False) -> Report:  # fmt: skip
    """Read the inputs, write every table and figure (or its skip reason) under ``out``, log to W&B."""
    if not runs:
        raise SystemExit("paper_tables: no inputs; pass task.runs=[<run dir or glob>,...]")
    if not (math.isfinite(memory_gib) and memory_gib > 0) or n_resamples < 1 or seed < 0:
        raise SystemExit(f"paper_tables: need memory_gib > 0, n_resamples >= 1 and seed >= 0, got {memory_gib}, "
                         f"{n_resamples}, {seed}")  # fmt: skip
    if logger_cfg and logger_cfg.get("mode", "disabled") != "disabled":
        from zoomr.tracking import resolve_mode

        resolve_mode(logger_cfg["mode"])  # a bad logger.mode or WANDB_MODE refused before any table is written
    t0 = time.time()
    inputs = discover([str(r) for r in runs])
    # two at once into one out each removed the files its index did not list, the other's among them, and the
    # index written last listed files the other had removed (or missed those it had written)
    with RunLock(out, "paper_tables", "give each its own task.out (--out)"):
        report = Report(Path(out))
        abridge_paper.build(inputs, report, memory_gib, n_resamples, seed, allow_different_settings)
        zoomr_paper.build(inputs, report, n_resamples, seed, allow_different_settings)
        kvzap_paper.build(inputs, report)
        index = report.write_index(inputs_summary(inputs))
    if logger_cfg and logger_cfg.get("mode", "disabled") != "disabled":
        from zoomr.tracking import init_run

        logger = init_run(
            project=logger_cfg.get("project", "zoomr"), entity=logger_cfg.get("entity"),
            name=f"paper_tables-{Path(out).name}", group=logger_cfg.get("group") or "paper_tables",
            tags=list(logger_cfg.get("tags") or []), mode=logger_cfg["mode"], dir=Path(out), job_type="analysis",
            config={"runs": [str(r) for r in runs], "out": str(out), "memory_gib": memory_gib,
                    "n_resamples": n_resamples, "seed": seed, "allow_different_settings": allow_different_settings},
        )  # fmt: skip
        report.log_wandb(logger)
        logger.finish()
    print(index)
    print(f"paper_tables: {len(report.tables)} tables, {len(report.figures)} figures, {len(report.skipped)} skipped, "
          f"{len(inputs.problems)} unusable inputs in {time.time() - t0:.1f} s -> {out}")  # fmt: skip
    if not any(inputs_summary(inputs)["counts"].values()):
        raise SystemExit(f"paper_tables: none of the {len(runs)} inputs is a run directory or bench JSON it can read "
                         f"(listed above and in {Path(out) / 'README.md'})")  # fmt: skip
    return report


def run_task(task: dict[str, Any], logger: dict[str, Any]) -> Report:
    """Entry from ``python -m analysis +task=paper_tables`` (the task and logger configs, resolved)."""
    from zoomr.schemas import to_dataclass
    from zoomr.schemas.analysis import PaperTablesTask

    try:
        t = to_dataclass(PaperTablesTask, task)  # validated before anything is written
    except ValueError as e:
        raise SystemExit(f"paper_tables: {e}") from None
    return build_all(t.runs, t.out, t.memory_gib, t.n_resamples, t.seed, logger, t.allow_different_settings)


def main(argv: list[str] | None = None) -> Report:
    p = argparse.ArgumentParser(prog="python -m analysis.paper_tables", description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", help="run directories, bench JSONs or globs (quote them; ** recurses)")
    p.add_argument("--out", type=output_dir, default="runs/analysis/paper_tables")
    p.add_argument("--memory-gib", type=float, default=8.0, help="Figure 3c's KV memory")
    p.add_argument("--n-resamples", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--logger", choices=["wandb", "none"], default="none", help="wandb: offline without a key")
    p.add_argument("--allow-different-settings", action="store_true",
                   help="tabulate arms whose fingerprints differ beyond model/method (the table lists how)")  # fmt: skip
    a = p.parse_args(argv)
    logger = {"mode": "auto", "project": "zoomr"} if a.logger == "wandb" else None
    return build_all(a.runs, a.out, a.memory_gib, a.n_resamples, a.seed, logger, a.allow_different_settings)
