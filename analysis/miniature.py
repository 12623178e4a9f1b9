"""The miniature reproduction (issue 15): every method and baseline on the CPU recall testbed, one command.

    python -m analysis +task=miniature [task.arms=[full,streaming,abridge]] [task.n=256]
        [task.test_seed=2000003] [task.trace_tokens=1024] [task.out=analysis/results/miniature]

Trains or reuses every model the chosen arms need (``python -m train``, runs under ``runs/train/mini-*``,
resumable; :mod:`analysis.miniature_plan`), then evaluates every arm through the evaluator (``python -m
eval benchmark=testbed``, greedy, one run directory per arm under ``<out>/arms/``, resumable) on the same
held-out problems (``task.test_seed``, disjoint from the training streams). Baselines get the measured
mean resident rows of the arm they are compared with. Writes ``table.md``, ``table.csv``, ``results.json``
(``{"meta": …, "arms": [{"name", "method", "rows_over_full", "answer_accuracy", "recall", "ci_vs_full",
…}]}``) and the figures (:mod:`analysis.miniature_report`). Paired 95% bootstrap intervals of answer
accuracy against the full-KV arm of the same model family (eval/bootstrap.py, one index matrix).
A rerun does only what is missing: a finished model or arm is reused when its command is unchanged.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from analysis.miniature_plan import ARMS, MODELS, Arm, full_arm, plan

log = logging.getLogger("miniature")
CMD_FILE = "miniature_command.json"


def checkpoint(model: str, trace_tokens: int) -> Path:
    return Path("runs/train") / MODELS[model].run_name(trace_tokens) / "final"


def train_command(model: str, trace_tokens: int) -> list[str]:
    m = MODELS[model]
    subs = {dep: str(checkpoint(dep, trace_tokens)) for dep in m.needs}
    args = [o.format(**subs) for o in m.overrides]
    length = [f"data.trace_tokens={trace_tokens}"]
    if m.overrides[0] == "+method=abridge":  # the whole trace fits (prompt + response + end of turn)
        length.append(f"method.max_response_tokens={trace_tokens + 16}")
    return [sys.executable, "-m", "train", *args, *length, f"run_name={m.run_name(trace_tokens)}", "logger=none"]


def benchmark_options(model: str, task: Any) -> list[str]:
    summaries = MODELS[model].summaries or any(MODELS[d].summaries for d in MODELS[model].needs)
    return [
        f"+benchmark.options.trace_tokens={task.trace_tokens}",
        f"+benchmark.options.summaries={str(summaries).lower()}",
        f"+benchmark.options.model_writes_summaries={str(summaries).lower()}",
        f"+benchmark.options.n_test={task.n}",
        f"+benchmark.options.test_seed={task.test_seed}",
    ]


def arm_dir(task: Any, name: str) -> Path:
    return Path(task.out) / "arms" / name.replace("@", "_at_")


def eval_command(arm: Arm, task: Any, match_rows: float | None) -> list[str]:
    cmd = [
        sys.executable, "-m", "eval", "benchmark=testbed", "model=tiny-testbed",
        f"model.hf_id={checkpoint(arm.model, task.trace_tokens)}", *benchmark_options(arm.model, task),
        "generation.temperature=0", "generation.n_samples=1", f"generation.max_new_tokens={task.trace_tokens + 64}",
        f"generation.batch_size={task.batch_size}", "logger=none", f"run_dir={arm_dir(task, arm.name)}",
        f"run_name={arm.name.replace('@', '_at_')}",
    ]  # fmt: skip
    if arm.yaml:
        cmd += [f"+method={arm.yaml}", *arm.overrides]
    if match_rows is not None:
        cmd.append(f"method.budget_rows={max(8, round(match_rows * arm.match_scale))}")
    return cmd


def run_logged(cmd: list[str], where: Path, threads: int) -> None:
    """Run ``cmd`` (output to the console and ``where/…log``); a failure stops the miniature, naming it."""
    where.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    print("$ " + shlex.join(cmd[1:]), flush=True)
    t0 = time.perf_counter()
    if subprocess.run(cmd, env=env).returncode != 0:
        raise SystemExit(f"miniature: this command failed (its run directory keeps what finished):\n  {shlex.join(cmd)}")
    print(f"  done in {time.perf_counter() - t0:.0f} s", flush=True)


def ensure_model(name: str, task: Any) -> Path:
    ckpt = checkpoint(name, task.trace_tokens)
    cmd = train_command(name, task.trace_tokens)
    if task.dry_run:
        print("train: " + shlex.join(cmd[1:]))
    elif not (ckpt.parent / "summary.json").exists():
        run_logged(cmd, ckpt.parent, task.threads)
    return ckpt


def arm_rows(metrics_dir: Path) -> float:
    return float(json.loads((metrics_dir / "metrics.json").read_text())["pooled"]["rows_mean"])


def ensure_arm(name: str, task: Any) -> Path:
    arm = ARMS[name]
    out = arm_dir(task, name)
    match_rows = arm_rows(arm_dir(task, arm.match)) if arm.match and not task.dry_run else None
    cmd = eval_command(arm, task, match_rows)
    if task.dry_run:
        print("eval:  " + shlex.join(cmd[1:]))
        return out
    saved = out / CMD_FILE
    done = (out / "metrics.json").exists() and saved.exists() and json.loads(saved.read_text()) == cmd[1:]
    if not done:
        run_logged(cmd, out, task.threads)
        saved.write_text(json.dumps(cmd[1:]))
    return out


def load_arm(out: Path) -> dict[str, Any]:
    """Per-problem correctness, recall and resident rows of a finished eval run, in problem order."""
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    rows.sort(key=lambda r: int(r["problem_id"].rsplit("-", 1)[1]))
    metrics = json.loads((out / "metrics.json").read_text())
    return {
        "ids": [r["problem_id"] for r in rows],
        "correct": np.array([float(r["correct"]) for r in rows]),
        "recall": np.array([r["recall_accuracy"] for r in rows], dtype=float),
        "rows": np.array([r["kv"]["rows_mean"] for r in rows], dtype=float),
        "metrics": metrics,
    }


def summarize(arms: list[str], task: Any) -> list[dict[str, Any]]:
    """One results.json entry per arm: rows over its family's full KV, accuracy, recall, paired CI."""
    from eval.bootstrap import index_matrix, paired_bootstrap

    loaded = {a: load_arm(arm_dir(task, a)) for a in arms}
    idx = index_matrix(task.n, task.n_resamples)
    out = []
    for name in arms:
        arm, r = ARMS[name], loaded[name]
        full = loaded[full_arm(arm)]
        if r["ids"] != full["ids"]:
            raise SystemExit(f"miniature: arm {name} and {full_arm(arm)} ran different problems; rerun both")
        ci = paired_bootstrap(r["correct"], full["correct"], idx)
        recall_ci = paired_bootstrap(r["recall"], full["recall"], idx)
        testbed = r["metrics"].get("testbed", {})
        out.append(
            {
                "name": name,
                "method": arm.method,
                "model": MODELS[arm.model].run_name(task.trace_tokens),
                "paired_with": full_arm(arm),
                "rows_over_full": float(r["rows"].mean() / full["rows"].mean()),
                "rows_mean": float(r["rows"].mean()),
                "answer_accuracy": float(r["correct"].mean()),
                "recall": float(r["recall"].mean()),
                "ci_vs_full": [ci.low, ci.high],
                "delta_vs_full": ci.delta,
                "recall_ci_vs_full": [recall_ci.low, recall_ci.high],
                "recall_by_distance": {k[len("recall_"):]: v for k, v in testbed.items()
                                       if k.startswith("recall_") and not k.endswith("_n") and k != "recall_all"},
                "compression": float(r["metrics"]["pooled"].get("compression", 0.0)),
                **({"matched_to": arm.match, "match_scale": arm.match_scale} if arm.match else {}),
                **arm.extra,
            }
        )  # fmt: skip
    return out


def run_task(task_cfg: dict[str, Any], logger: dict[str, Any] | None = None) -> dict[str, Any]:
    from analysis.miniature_report import write_report
    from zoomr.schemas import to_dataclass
    from zoomr.schemas.analysis import MiniatureTask

    task = to_dataclass(MiniatureTask, task_cfg)
    models, arms = plan(task.arms)  # an unknown arm is refused before anything runs
    t0 = time.perf_counter()
    print(f"miniature: {len(models)} models ({', '.join(models)}), {len(arms)} arms, {task.n} problems, "
          f"test seed {task.test_seed}, {task.trace_tokens}-token traces -> {task.out}", flush=True)  # fmt: skip
    for m in models:
        ensure_model(m, task)
    for a in arms:
        ensure_arm(a, task)
    if task.dry_run:
        return {}
    results = {
        "meta": {
            "test_seed": task.test_seed,
            "n_problems": task.n,
            "trace_tokens": task.trace_tokens,
            "models": {m: str(checkpoint(m, task.trace_tokens)) for m in models},
            "threads": task.threads,
            "seconds": round(time.perf_counter() - t0, 1),
        },
        "arms": summarize(arms, task),
    }
    write_report(results, Path(task.out))
    return results


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(description="the miniature reproduction (see python -m analysis +task=miniature)")
    p.add_argument("--arms", nargs="*", default=[])
    p.add_argument("--n", type=int, default=256)
    p.add_argument("--test-seed", type=int, default=2_000_003)
    p.add_argument("--trace-tokens", type=int, default=1024)
    p.add_argument("--out", default="runs/miniature")
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv)
    run_task({"arms": a.arms, "n": a.n, "test_seed": a.test_seed, "trace_tokens": a.trace_tokens, "out": a.out,
              "dry_run": a.dry_run})  # fmt: skip


if __name__ == "__main__":
    main()
