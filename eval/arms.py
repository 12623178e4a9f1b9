"""One evaluation arm as a call: ``python -m eval`` on a checkpoint with a cache policy, resumable, and its
per-problem results read back (what the miniature and the AbridgeKV recipe's closing table run).

An arm is the evaluator's own command line (so it validates, resumes, fingerprints and writes
``results.jsonl`` / ``metrics.json`` exactly as a user's run does), run in a subprocess with its own
threads; :func:`run_arm` skips it when its directory already holds a finished run of the same command (wherever
that directory was when it ran).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eval.results import result_row_problem
from zoomr.jsonl import BadRowError, read_json, read_json_object, read_jsonl
from zoomr.rundir import write_json

COMMAND_FILE = "arm_command.json"


@dataclass
class ArmResult:
    """A finished arm, per problem in problem order."""

    ids: list[str]
    correct: np.ndarray
    recall: np.ndarray  # testbed per-fact recall (nan elsewhere)
    rows: np.ndarray  # mean resident rows per (layer, KV head) over decoding
    metrics: dict[str, Any]

    @property
    def accuracy(self) -> float:
        return float(self.correct.mean())


def testbed_command(
    checkpoint: str | Path,
    run_dir: str | Path,
    options: dict[str, Any],
    method: list[str] | None = None,
    batch_size: int = 64,
    max_new_tokens: int | None = None,
) -> list[str]:
    """``python -m eval benchmark=testbed`` greedy on ``checkpoint`` with testbed ``options``
    (:class:`zoomr.schemas.testbed.TestbedData` fields, e.g. n_test, test_seed) and ``method`` overrides
    (``["+method=h2o", "method.budget_rows=300"]``; None = full KV)."""
    opts = [f"++benchmark.options.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in options.items()]
    cap = max_new_tokens or int(options.get("trace_tokens", 1024)) + 64
    name = Path(run_dir).name
    return [
        sys.executable, "-m", "eval", "benchmark=testbed", "model=tiny-testbed", f"model.hf_id={checkpoint}", *opts,
        "generation.temperature=0", "generation.n_samples=1", f"generation.max_new_tokens={cap}",
        f"generation.batch_size={batch_size}", "logger=none", f"run_dir={run_dir}", f"run_name={name}",
        *(method or []),
    ]  # fmt: skip


def run_command(cmd: list[str], threads: int | None = None, what: str = "command", log: Path | None = None) -> None:
    """Run an entry point's command line in a subprocess (its progress bars on the console, or into ``log``
    when given); a failure is a SystemExit naming the command (its run directory keeps what finished)."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    if log is None:
        print("$ " + shlex.join(["python", *cmd[1:]]), flush=True)
    t0 = time.perf_counter()
    if log is None:
        failed = subprocess.run(cmd, env=env).returncode != 0
    else:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as out:
            out.write("$ " + shlex.join(["python", *cmd[1:]]) + "\n")
            out.flush()
            failed = subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT).returncode != 0
    if failed:
        where = f" (its output: {log})" if log else ""
        raise SystemExit(f"{what} failed{where}; its run directory keeps what finished:\n  {shlex.join(cmd)}")
    if log is None:
        print(f"  done in {time.perf_counter() - t0:.0f} s", flush=True)


LOG_FILE = "arm.log"  # an arm's console output when it runs beside others (``quiet``)


def run_arm(cmd: list[str], run_dir: str | Path, threads: int | None = None, quiet: bool = False) -> ArmResult:
    """Run the eval command ``cmd`` unless ``run_dir`` holds a finished run of the same command; read it.
    ``quiet``: its console output goes to ``run_dir/arm.log`` (arms running side by side)."""
    run_dir = Path(run_dir)
    if not arm_done(cmd, run_dir):
        run_command(cmd, threads, what=f"arm {run_dir.name}", log=run_dir / LOG_FILE if quiet else None)
        write_json(run_dir / COMMAND_FILE, cmd[1:])
    return load_arm(run_dir)


def arm_done(cmd: list[str], run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds a finished run of the eval command ``cmd``, which :func:`run_arm` reuses."""
    saved = Path(run_dir) / COMMAND_FILE
    if not ((Path(run_dir) / "metrics.json").exists() and saved.exists()):
        return False
    return experiment(read_json(saved, "arm command")) == experiment(cmd[1:])


def experiment(args: list[str]) -> list[str]:
    """An arm's command line without its ``run_dir=``: where a run lies is not part of the experiment, so a finished
    arm directory that was moved or copied (e.g. the committed slim copies under another ``task.out``) is reused."""
    return [a for a in args if not a.startswith("run_dir=")]


def load_arm(run_dir: str | Path) -> ArmResult:
    """Per-problem correctness, recall and resident rows of a finished eval run (first sample of each)."""
    run_dir = Path(run_dir)
    rows = read_jsonl(run_dir / "results.jsonl", _arm_row_problem)  # a torn or malformed row is named (BadRowError)
    if not rows:  # an emptied file: its accuracy and rows would be the mean of nothing (nan)
        raise BadRowError(f"{run_dir / 'results.jsonl'}: no result rows (not a finished eval run)")
    metrics = read_json_object(run_dir / "metrics.json", "eval metrics")
    if not isinstance(metrics.get("pooled"), dict):
        raise BadRowError(f"{run_dir / 'metrics.json'}: no pooled metrics (not an eval run's metrics.json)")
    first = {r["problem_id"]: r for r in sorted(rows, key=lambda r: r["sample"], reverse=True)}
    ordered = sorted(first.values(), key=lambda r: _problem_order(r["problem_id"]))
    return ArmResult(
        ids=[r["problem_id"] for r in ordered],
        correct=np.array([float(r["correct"]) for r in ordered]),
        recall=np.array([r.get("recall_accuracy", np.nan) for r in ordered], dtype=float),
        rows=np.array([r["kv"]["rows_mean"] for r in ordered], dtype=float),
        metrics=metrics,
    )


def _arm_row_problem(row: dict[str, Any]) -> str | None:
    return result_row_problem(row) or (None if "rows_mean" in row.get("kv", {}) else "an eval row without kv.rows_mean")


def _problem_order(problem_id: str) -> tuple[str, int]:
    head, _, tail = problem_id.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (problem_id, 0)
