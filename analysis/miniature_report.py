"""The miniature's outputs: ``table.md``, ``table.csv``, ``results.json`` and figures (issue 15).

Figures: answer accuracy against resident rows over full KV for every arm (the papers' Pareto view) and
recall by reference distance per arm.

A rerun of some arms (``task.arms=[…]``, e.g. after one model's recipe changed) merges into a full table with

    python -m analysis.miniature_report --merge runs/miniature/results.json --into analysis/results/miniature

(arms of the same name are replaced, new ones appended, the models they used recorded; both must be on the same
test seed, problem count and trace length).
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path
from typing import Any

COLUMNS = ("name", "method", "rows_over_full", "answer_accuracy", "ci_vs_full", "recall", "paired_with")


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        f"Miniature: {meta['n_problems']} held-out problems (test seed {meta['test_seed']}), "
        f"{meta['trace_tokens']}-token traces, greedy. Δ = answer accuracy − full KV's (paired 95% CI).",
        "",
        "| arm | method | rows / full | answer acc | Δ vs full [95% CI] | recall | paired with |",
        "|---|---|---|---|---|---|---|",
    ]
    for a in results["arms"]:
        lo, hi = a["ci_vs_full"]
        lines.append(
            f"| {a['name']} | {a['method']} | {a['rows_over_full']:.3f} | {a['answer_accuracy']:.3f} | "
            f"{a['delta_vs_full']:+.3f} [{lo:+.3f}, {hi:+.3f}] | {a['recall']:.3f} | {a['paired_with']} |"
        )
    return "\n".join(lines) + "\n"


def write_csv(results: dict[str, Any], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*COLUMNS[:4], "ci_low", "ci_high", *COLUMNS[5:]])
        for a in results["arms"]:
            lo, hi = a["ci_vs_full"]
            w.writerow([a["name"], a["method"], f"{a['rows_over_full']:.4f}", f"{a['answer_accuracy']:.4f}",
                        f"{lo:.4f}", f"{hi:.4f}", f"{a['recall']:.4f}", a["paired_with"]])  # fmt: skip


def label_positions(points: list[tuple[float, float]], min_dx: float, min_dy: float) -> list[tuple[float, float]]:
    """A label position beside each point (data coordinates), moved down the page in ``min_dy`` steps until it is
    at least ``min_dx`` across or ``min_dy`` up or down from every label placed before it (top to bottom)."""
    placed: list[tuple[float, float]] = []
    out: dict[int, tuple[float, float]] = {}
    for i in sorted(range(len(points)), key=lambda i: (-points[i][1], points[i][0])):
        x, y = points[i]
        while any(abs(x - px) < min_dx and abs(y - py) < min_dy for px, py in placed):
            y -= min_dy
        placed.append((x, y))
        out[i] = (x, y)
    return [out[i] for i in range(len(points))]


def pareto_figure(results: dict[str, Any], path: Path) -> None:
    """Answer accuracy against resident rows / full KV's: one colour per method (legend), squares for the summaries
    traces' arms, hollow markers for arms at another block size than the arm named ``abridge`` (the method's main
    configuration); a label for each arm that scores at least 0.05 (the arms near 0 are told apart by colour)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5.6))
    arms = results["arms"]
    methods = sorted({a["method"] for a in arms})
    colours = {m: plt.cm.tab20(i % 20) for i, m in enumerate(methods)}
    main_block = next((a.get("block_size") for a in arms if a["name"] == "abridge"), None)
    for a in arms:
        marker = "s" if a["paired_with"] == "full_summaries" else "o"
        hollow = a.get("block_size") not in (None, main_block)
        ax.scatter(a["rows_over_full"], a["answer_accuracy"], marker=marker, s=40, linewidths=1.2,
                   facecolors="none" if hollow else colours[a["method"]], edgecolors=colours[a["method"]])  # fmt: skip
    labelled = [a for a in arms if a["answer_accuracy"] >= 0.05]
    where = label_positions([(a["rows_over_full"], a["answer_accuracy"]) for a in labelled], 0.17, 0.028)
    for a, (x, y) in zip(labelled, where):
        ax.annotate(a["name"], (a["rows_over_full"], a["answer_accuracy"]), xytext=(x + 0.012, y), fontsize=7,
                    va="center", arrowprops={"arrowstyle": "-", "lw": 0.4, "color": "0.6"} if y != a["answer_accuracy"] else None)  # fmt: skip
    for m in methods:
        ax.scatter([], [], color=colours[m], marker="o", s=30, label=m)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), title="method", title_fontsize=8)
    ax.set_xlabel("mean resident KV rows / full KV's")
    ax.set_ylabel("answer accuracy (all 8 final recalls right)")
    ax.set_xlim(0, 1.15)
    ax.set_ylim(-0.03, 1.05)
    ax.grid(alpha=0.3)
    ax.set_title(f"Miniature: accuracy vs memory ({results['meta']['n_problems']} problems; squares: summaries traces; "
                 "hollow: variant block size)", fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def recall_figure(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    arms = results["arms"]
    buckets = sorted({b for a in arms for b in a["recall_by_distance"]}, key=_bucket_order)
    fig, ax = plt.subplots(figsize=(max(7, 0.5 * len(arms)), 4))
    width = 0.8 / max(len(buckets), 1)
    x = np.arange(len(arms))
    for j, b in enumerate(buckets):
        ax.bar(x + j * width, [a["recall_by_distance"].get(b, np.nan) for a in arms], width, label=f"distance {b}")
    ax.set_xticks(x + 0.4 - width / 2, [a["name"] for a in arms], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("per-fact recall")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _bucket_order(b: str) -> int:
    return {"<64": 0, "64-256": 1, ">256": 2}.get(b, 3)


def write_report(results: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(results)
    (out / "table.md").write_text(text)
    write_csv(results, out / "table.csv")
    (out / "results.json").write_text(json.dumps(results, indent=2))
    pareto_figure(results, out / "pareto.png")
    recall_figure(results, out / "recall_by_distance.png")
    print("\n" + text + f"\nwritten {out}/table.md, table.csv, results.json, pareto.png, recall_by_distance.png")


MATCHED_META = ("test_seed", "n_problems", "trace_tokens")  # what makes two runs' arms comparable


def merge(results: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``results`` with the arms of ``new`` in place of those of the same name (new names appended) and the
    models ``new`` used; refused (``ValueError``) unless both ran on the same problems."""
    wrong = [f"{k}: {results['meta'].get(k)} vs {new['meta'].get(k)}" for k in MATCHED_META
             if results["meta"].get(k) != new["meta"].get(k)]  # fmt: skip
    if wrong:
        raise ValueError(f"the runs are not on the same problems ({'; '.join(wrong)}): their arms cannot share a table")
    fresh = {a["name"]: a for a in new["arms"]}
    arms = [fresh.pop(a["name"], a) for a in results["arms"]] + list(fresh.values())
    meta = {**results["meta"], "models": {**results["meta"].get("models", {}), **new["meta"].get("models", {})}}
    return {**results, "meta": meta, "arms": arms}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Merge a miniature rerun's arms into a full miniature table.")
    p.add_argument("--merge", required=True, help="results.json of the rerun")
    p.add_argument("--into", required=True, help="directory of the table to update (its results.json)")
    args = p.parse_args(argv)
    paths = [Path(args.merge), Path(args.into) / "results.json"]
    if missing := [str(x) for x in paths if not x.is_file()]:
        p.error(f"no such file: {', '.join(missing)}")
    new, results = (json.loads(x.read_text()) for x in paths)
    try:
        merged = merge(results, new)
    except ValueError as e:
        p.error(str(e))
    write_report(merged, Path(args.into))


if __name__ == "__main__":
    main()
