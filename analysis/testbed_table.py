"""The recall testbed's results table: greedy accuracy of full KV vs StreamingLLM and H2O at fractions of
the full rows, with recall by reference distance (issue 7; a table, a JSON and a plot).

    python -m analysis.testbed_table --model runs/train/tb-nosum/final --model runs/train/tb-sum/final \\
        --n 256 --fractions 0.5 0.25 --out runs/testbed_table
    python -m analysis +task=testbed_table 'task.args=[--model,<checkpoint>]'

Each model is evaluated on the test problems of the data it was trained on (``testbed_data.json`` in the
checkpoint: with or without summaries), ``--n`` fixed problems from the data's test seed. Every arm runs
through the evaluator (``benchmark=testbed``, :func:`eval.testbed_task.testbed_arm`): every answer is the
model's greedy choice through the project's decode engine; the environment writes the trace's random
facts (``zoomr.engine.generate(script=…)``). A budget of fraction f is ``round(f x R)`` rows per layer and
KV head, R the mean rows full KV holds at the end of a problem; the table also reports the measured mean
resident rows over the decode and its ratio to full KV's. Intervals: paired bootstrap over problems
against full KV (one shared index matrix, ``eval/bootstrap.py``). Finished arms are saved under
``<out>/arms/`` and reused when rerun with the same settings; an arm's evaluator run directory sits beside
its JSON, so a killed arm resumes from its finished rows.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from analysis.cli import require_at_least, require_checkpoint, require_testbed_data
from zoomr.paths import output_dir
from zoomr.rundir import read_json
from zoomr.testbed.grading import BUCKETS as DISTANCE_BUCKETS

BUCKETS = tuple(name for *_, name in DISTANCE_BUCKETS)  # recall columns, nearest first


def arms_for(fractions: list[float], rows: float, n_sink: int) -> dict[str, dict[str, Any]]:
    arms: dict[str, dict[str, Any]] = {"full": {"policy": "full"}}
    for f in fractions:
        budget = max(n_sink + 1, round(f * rows))
        arms[f"streaming@{f:g}"] = {"policy": "streaming", "budget_rows": budget, "n_sink": n_sink}
        arms[f"h2o@{f:g}"] = {"policy": "h2o", "budget_rows": budget}
    return arms


def evaluate_arm(model, tok, data, n: int, policy: dict[str, Any], batch: int, run_dir: Path) -> dict[str, Any]:
    """One arm through the evaluator (:func:`eval.testbed_task.testbed_arm`, resumed from ``run_dir``),
    summarised from its rows: accuracy, recall by distance, resident rows, step time."""
    from eval.testbed_task import testbed_arm
    from zoomr.testbed.grading import grade, load_test_problems, summarize

    t0 = time.perf_counter()
    rows = testbed_arm(model, tok, data, n, policy, run_dir, batch).rows
    step_s = [r["decode"]["step_s"] for r in rows if r["decode"]["step_s"] is not None]
    # the full grade of each row's text (the rows keep recall; with summaries it also scores the summary blocks)
    grades = [grade(rec, r["text"]) for rec, r in zip(load_test_problems(data, n), rows)]
    return {
        "policy": policy,
        **summarize(grades),
        "rows_mean": float(np.mean([r["kv"]["rows_mean"] for r in rows])),
        "step_ms": 1000 * float(np.mean(step_s)),
        "seconds": round(time.perf_counter() - t0, 1),
        "model_tokens": int(np.mean([r["n_tokens"] - r["decode"]["n_scripted"] for r in rows])),
        "correct": [float(r["correct"]) for r in rows],
        "recall": [r["recall_accuracy"] for r in rows],
    }


def key_digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def cached(path: Path, key: dict[str, Any], compute) -> dict[str, Any]:
    """Reuse ``path`` if it was written for ``key``; otherwise compute and write it. ``compute(run_dir)``
    decodes through the evaluator into ``<path stem>-<key digest>/`` next to it, so an arm killed midway
    resumes from its finished rows."""
    digest = key_digest(key)
    saved = read_json(path)  # None when absent or torn (then computed again: its arms resume from their rows)
    if isinstance(saved, dict) and saved.get("key_digest") == digest:
        return saved
    result = {**compute(path.with_name(f"{path.stem}-{digest}")), "key": key, "key_digest": digest}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(path)
    return result


def add_intervals(results: dict[str, dict[str, Any]]) -> None:
    from eval.bootstrap import index_matrix, paired_bootstrap

    full = results["full"]
    idx = index_matrix(len(full["correct"]))
    for r in results.values():
        for metric in ("correct", "recall"):
            ci = paired_bootstrap(np.array(r[metric]), np.array(full[metric]), idx)
            r[f"{metric}_vs_full"] = {"delta": ci.delta, "low": ci.low, "high": ci.high}
        r["rows_ratio"] = r["rows_mean"] / full["rows_mean"]
        r["step_time_ratio"] = r["step_ms"] / full["step_ms"]


def table(model_name: str, results: dict[str, dict[str, Any]]) -> str:
    head = (
        "| model | arm | budget | rows/full | answer acc | Δ vs full [95% CI] | recall | "
        + " | ".join(f"recall {b}" for b in BUCKETS)
        + " | step × |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for arm, r in results.items():
        c = r["correct_vs_full"]
        budget = r["policy"].get("budget_rows", "all")
        lines.append(
            f"| {model_name} | {arm} | {budget} | {r['rows_ratio']:.2f} | {r['answer_accuracy']:.3f} | "
            f"{c['delta']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}] | {r['recall_all']:.3f} | "
            + " | ".join(f"{r[f'recall_{b}']:.3f}" for b in BUCKETS)
            + f" | {r['step_time_ratio']:.2f} |"
        )
    return "\n".join(lines)


def plot(all_results: dict[str, dict[str, dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(all_results), figsize=(6 * len(all_results), 3.8), squeeze=False)
    for ax, (model_name, results) in zip(axes[0], all_results.items()):
        width = 0.8 / len(results)
        for j, (arm, r) in enumerate(results.items()):
            ys = [r[f"recall_{b}"] for b in BUCKETS] + [r["answer_accuracy"]]
            ax.bar(np.arange(4) + j * width, ys, width, label=arm)
        ax.set_xticks(np.arange(4) + 0.4 - width / 2, [f"recall {b}" for b in BUCKETS] + ["answer"])
        ax.set_ylim(0, 1.05)
        ax.set_title(model_name)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))  # the whole first paragraph
    p.add_argument("--model", action="append", required=True, help="a testbed checkpoint (repeatable)")
    p.add_argument("--n", type=int, default=256, help="test problems (fixed seed)")
    p.add_argument("--fractions", type=float, nargs="+", default=[0.5, 0.25])
    p.add_argument("--trace-tokens", type=int, default=None, help="default: the length the model was trained at")
    p.add_argument("--test-seed", type=int, default=None, help="default: the data's test seed")
    p.add_argument("--n-sink", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--out", type=output_dir, default="runs/testbed_table")
    args = p.parse_args(argv)
    require_at_least(p, args, 1, "n", "batch", "trace_tokens")
    require_at_least(p, args, 0, "n_sink")
    if not all(0 < f <= 1 for f in args.fractions):
        p.error(f"--fractions {args.fractions}: each must lie in (0, 1] (a share of full KV's rows)")
    for path in args.model:
        require_checkpoint(p, path)

    from dataclasses import asdict

    from zoomr.testbed.checkpoint import full_rows, load_testbed_model
    from zoomr.testbed.grading import load_test_problems

    # every model's data settings checked before anything is written
    datas = {m: require_testbed_data(p, m, trace_tokens=args.trace_tokens, test_seed=args.test_seed) for m in args.model}
    out = Path(args.out)
    (out / "arms").mkdir(parents=True, exist_ok=True)
    all_results: dict[str, dict[str, dict[str, Any]]] = {}
    tables = []
    for path in args.model:
        data = datas[path]
        name = f"{Path(path).parent.name}{' (summaries)' if data.summaries else ''}"
        model, tok = load_testbed_model(path)
        records = load_test_problems(data, args.n)
        rows = full_rows(records)
        results = {}
        for arm, policy in arms_for(args.fractions, rows, args.n_sink).items():
            key = {"model": str(Path(path).resolve()), "data": asdict(data), "n": args.n, "policy": policy}
            tag = hashlib.sha256(key["model"].encode()).hexdigest()[:8]
            results[arm] = cached(
                out / "arms" / f"{tag}-{arm}.json", key, functools.partial(evaluate_arm, model, tok, data, args.n, policy, args.batch)
            )
            r = results[arm]
            print(
                f"{name} {arm}: answer {r['answer_accuracy']:.3f} recall {r['recall_all']:.3f} "
                f"(>256: {r['recall_>256']:.3f}) rows {r['rows_mean']:.0f} [{r['seconds']}s]",
                flush=True,
            )
        add_intervals(results)
        all_results[name] = results
        tables.append(table(name, results))
        meta = {"data": asdict(data), "full_rows_end": rows, "problems": len(records)}
        all_results[name]["_meta"] = meta  # type: ignore[assignment]
    text = "\n\n".join(tables)
    print("\n" + text)
    (out / "table.md").write_text(text + "\n")
    (out / "results.json").write_text(
        json.dumps({"args": vars(args), "threads": torch.get_num_threads(), "results": all_results}, indent=2)
    )
    plot({m: {a: r for a, r in res.items() if not a.startswith("_")} for m, res in all_results.items()}, out / "recall_by_distance.png")
    print(f"\nwritten {out / 'table.md'}, {out / 'results.json'}, {out / 'recall_by_distance.png'}")
    return all_results


if __name__ == "__main__":
    from zoomr.script import run_script

    run_script(main)
