"""KVzap's long-context figures from evaluator runs (RULER / LongBench, ``eval/tasks.py``): per-arm score
vs achieved compression (KVzap paper Fig. 2-3), per-subset scores (Fig. 9-15) and the per-prompt
compression of each arm (Fig. 5, left). A table, a JSON and two plots.

    python -m analysis.long_context_table runs/eval/ruler_4096/qwen3-8b/* --out runs/long_context/ruler_4096
    python -m analysis +task=long_context_table 'task.args=[runs/eval/longbench/qwen3-8b/full,runs/eval/longbench/qwen3-8b/kvzap-t4]'

Each argument is a run directory of ``python -m eval benchmark=ruler|longbench`` (its ``metrics.json`` and
``results.jsonl``); the arm is named by the directory. Compression is the fraction of KV pairs removed
(kvpress's ratio), measured per prompt in every result row; the score is the benchmark's average over
subsets (LongBench: also without TREC).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

TASKS = ("ruler", "longbench")


def read_arm(run_dir: Path) -> dict[str, Any]:
    """One arm's summary (task, averages, compression, per-subset scores) and its per-prompt compressions."""
    metrics_path = run_dir / "metrics.json"
    if not metrics_path.exists():
        raise FileNotFoundError(f"{run_dir}: no metrics.json (run python -m eval there first)")
    metrics = json.loads(metrics_path.read_text())
    task = next((t for t in TASKS if t in metrics), None)
    if task is None:
        raise ValueError(
            f"{run_dir}: not a RULER or LongBench run (metrics.json has no {' / '.join(TASKS)} key)"
        )
    m = metrics[task]
    rows = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines() if line.strip()]
    per_prompt = [r["kv"]["compression"] for r in rows if "compression" in (r.get("kv") or {})]
    return {
        "arm": run_dir.name,
        "task": task,
        "average": m.get("average"),
        "average_without_trec": m.get("average_without_trec"),
        "compression": m.get("compression"),
        "subsets": {name: s["score"] for name, s in m["subsets"].items()},
        "per_prompt_compression": per_prompt,
    }


def format_table(arms: list[dict[str, Any]]) -> str:
    """Arms as rows: compression (x-fold too), averages, then every subset's score."""
    subsets = list(dict.fromkeys(s for a in arms for s in a["subsets"]))
    trec = any(a["average_without_trec"] is not None for a in arms)
    cols = ["arm", "compr.", "x-fold", "average", *(["w/o trec"] if trec else []), *subsets]
    width = max(10, *(len(c) for c in cols))
    lines = [" ".join(f"{c:>{width}}" for c in cols)]

    def num(x: float | None, fmt: str = ".2f") -> str:
        return f"{x:>{width}{fmt}}" if x is not None else f"{'-':>{width}}"

    for a in arms:
        c = a["compression"]
        fold = 1 / (1 - c) if c is not None and c < 1 else None
        cells = [f"{a['arm']:>{width}}", num(c, ".3f"), num(fold), num(a["average"])]
        cells += [num(a["average_without_trec"])] if trec else []
        cells += [num(a["subsets"].get(s)) for s in subsets]
        lines.append(" ".join(cells))
    return "\n".join(lines)


def plot(arms: list[dict[str, Any]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for a in arms:
        ax.scatter(a["compression"] or 0.0, a["average"], label=a["arm"])
    ax.set_xlabel("compression (fraction of KV pairs removed)")
    ax.set_ylabel(f"{arms[0]['task']} average score")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    paths = [out / "score_vs_compression.png"]
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    for a in arms:
        if a["per_prompt_compression"] and np.ptp(a["per_prompt_compression"]) > 0:
            ax.hist(a["per_prompt_compression"], bins=30, alpha=0.5, label=a["arm"])
    ax.set_xlabel("per-prompt compression")
    ax.set_ylabel("prompts")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "per_prompt_compression.png")
    fig.savefig(paths[1], dpi=120)
    plt.close(fig)
    return paths


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="eval run directories (one per arm)")
    parser.add_argument("--out", type=Path, default=Path("runs/long_context"), help="table, JSON and plots")
    args = parser.parse_args(argv)
    arms = [read_arm(r) for r in args.runs]
    tasks = {a["task"] for a in arms}
    if len(tasks) > 1:
        raise SystemExit(f"runs of different benchmarks ({sorted(tasks)}): compare one benchmark at a time")
    args.out.mkdir(parents=True, exist_ok=True)
    table = format_table(arms)
    report = {
        "task": tasks.pop(),
        "arms": [
            {
                **{k: v for k, v in a.items() if k != "per_prompt_compression"},
                "per_prompt_compression": {
                    "mean": float(np.mean(a["per_prompt_compression"]))
                    if a["per_prompt_compression"]
                    else None,
                    "min": float(np.min(a["per_prompt_compression"]))
                    if a["per_prompt_compression"]
                    else None,
                    "max": float(np.max(a["per_prompt_compression"]))
                    if a["per_prompt_compression"]
                    else None,
                },
            }
            for a in arms
        ],
    }
    (args.out / "long_context.json").write_text(json.dumps(report, indent=2))
    (args.out / "table.txt").write_text(table + "\n")
    plots = plot(arms, args.out)
    print(
        f"\n{table}\n\nwritten: {args.out / 'long_context.json'}, {', '.join(str(p) for p in plots)}",
        flush=True,
    )
    return report


if __name__ == "__main__":
    main()
