"""The miniature's outputs: ``table.md``, ``table.csv``, ``results.json`` and figures (issue 15).

Figures: answer accuracy against resident rows over full KV for every arm (the papers' Pareto view, with the arms
that keep most of full KV's accuracy zoomed in beside it) and recall by reference distance per arm.

A rerun of some arms (``task.arms=[…]``, e.g. after one model's recipe changed) merges into a full table with

    python -m analysis.miniature_report --merge runs/miniature/results.json --into analysis/results/miniature

(arms of the same name are replaced, new ones appended, the models they used recorded; both must be on the same
test seed, problem count and trace length).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

from zoomr.jsonl import read_json_object
from zoomr.rundir import replace_file, write_text_atomic

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
    f = io.StringIO()
    w = csv.writer(f)
    w.writerow([*COLUMNS[:4], "ci_low", "ci_high", *COLUMNS[5:]])
    for a in results["arms"]:
        lo, hi = a["ci_vs_full"]
        w.writerow([a["name"], a["method"], f"{a['rows_over_full']:.4f}", f"{a['answer_accuracy']:.4f}",
                    f"{lo:.4f}", f"{hi:.4f}", f"{a['recall']:.4f}", a["paired_with"]])  # fmt: skip
    write_text_atomic(path, f.getvalue(), newline="")


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


ZOOM_DELTA = -0.1  # the right panel of the Pareto figure: arms within 10 points of their full KV arm
LOSSLESS = -0.02  # "within 2 points of full KV" (the bar for AbridgeKV 4:1 and KVzap), drawn there


def pareto_front(arms: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The arms no other arm dominates (as accurate or more with fewer rows, or more accurate with as few), by
    rows: the memory-accuracy frontier the papers draw."""
    by_rows = sorted(arms, key=lambda a: (a["rows_over_full"], -a["answer_accuracy"]))
    front: list[dict[str, Any]] = []
    for a in by_rows:
        if not front or a["answer_accuracy"] > front[-1]["answer_accuracy"]:
            front.append(a)
    return front


def _draw_arms(ax, arms: list[dict[str, Any]], y_key: str, colours: dict[str, Any], main_block: Any) -> None:
    """Markers at (rows / full, ``y_key``): squares for the summaries traces' arms, hollow for another block size
    than the main ``abridge`` arm's; with ``y_key="delta_vs_full"`` each arm's paired 95% interval as a bar."""
    for a in arms:
        colour = colours[a["method"]]
        hollow = a.get("block_size") not in (None, main_block)
        x, y = a["rows_over_full"], a[y_key]
        if y_key == "delta_vs_full" and a.get("paired_with"):
            lo, hi = a["ci_vs_full"]
            ax.errorbar(x, y, yerr=[[y - lo], [hi - y]], color=colour, lw=0.8, capsize=2, alpha=0.55, zorder=1)
        ax.scatter(x, y, marker="s" if a["paired_with"] == "full_summaries" else "o", s=40, linewidths=1.2,
                   facecolors="none" if hollow else colour, edgecolors=colour, zorder=2)  # fmt: skip


def _label_arms(ax, arms: list[dict[str, Any]], y_key: str, min_dx: float, min_dy: float) -> None:
    where = label_positions([(a["rows_over_full"], a[y_key]) for a in arms], min_dx, min_dy)
    for a, (x, y) in zip(arms, where):
        moved = y != a[y_key]
        ax.annotate(a["name"], (a["rows_over_full"], a[y_key]), xytext=(x + 0.012, y), fontsize=7, va="center",
                    arrowprops={"arrowstyle": "-", "lw": 0.4, "color": "0.6"} if moved else None)  # fmt: skip


def pareto_figure(results: dict[str, Any], path: Path) -> None:
    """Two panels against mean resident rows / full KV's. Left, the papers' Pareto view: every arm's answer accuracy
    (labels for the arms between 0.05 and the near-lossless ones; those near 0 are told apart by colour) and the
    Pareto front (dashed). Right, the arms within :data:`ZOOM_DELTA` of their full KV arm: Δ answer accuracy vs it
    with the paired 95% interval, lines at 0 and :data:`LOSSLESS`. One colour per method (legend), squares for the
    summaries traces' arms (paired with ``full_summaries``), hollow markers for arms at another block size than
    the arm named ``abridge`` (the method's main configuration)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, zoom) = plt.subplots(1, 2, figsize=(15, 5.8), gridspec_kw={"width_ratios": [1, 1.15]})
    arms = results["arms"]
    methods = sorted({a["method"] for a in arms})
    colours = {m: plt.cm.tab20(i % 20) for i, m in enumerate(methods)}
    main_block = next((a.get("block_size") for a in arms if a["name"] == "abridge"), None)
    near = [a for a in arms if a.get("paired_with") and a["delta_vs_full"] >= ZOOM_DELTA]
    _draw_arms(ax, arms, "answer_accuracy", colours, main_block)
    far = [a for a in arms if a["answer_accuracy"] >= 0.05 and a not in near]
    _label_arms(ax, far, "answer_accuracy", 0.17, 0.028)
    front = pareto_front(arms)
    ys = [a["answer_accuracy"] for a in front]
    ax.step([a["rows_over_full"] for a in front] + [1.15], ys + ys[-1:], where="post", color="0.35", lw=0.9,
            ls="--", zorder=0, label="Pareto front")  # fmt: skip
    ax.legend(fontsize=7, loc="center right")
    ax.set_xlim(0, 1.15)
    ax.set_ylim(-0.03, 1.05)
    ax.set_ylabel("answer accuracy (all 8 final recalls right)")
    ax.set_title(f"every arm (unlabelled at the top: within {-ZOOM_DELTA:.0%} of full KV, right)", fontsize=9)
    if near:
        _draw_arms(zoom, near, "delta_vs_full", colours, main_block)
        low = min(min(a["ci_vs_full"][0] for a in near), ZOOM_DELTA)
        high = max(max(a["ci_vs_full"][1] for a in near), 0.0)
        _label_arms(zoom, near, "delta_vs_full", 0.2, (high - low) / 36)
        zoom.set_ylim(low - 0.005, high + 0.005)
    zoom.axhline(0, color="0.3", lw=0.8)
    zoom.axhline(LOSSLESS, color="0.3", lw=0.8, ls=":")
    zoom.text(0.01, LOSSLESS, f"{LOSSLESS * 100:+.0f} points", fontsize=7, color="0.3", va="bottom")
    zoom.set_xlim(0, 1.15)
    zoom.set_ylabel("Δ answer accuracy vs full KV (paired 95% CI)")
    zoom.set_title(f"arms within {-ZOOM_DELTA:.0%} of their full KV arm (squares: vs full KV on summaries traces)",
                   fontsize=9)  # fmt: skip
    for a_ in (ax, zoom):
        a_.set_xlabel("mean resident KV rows / full KV's")
        a_.grid(alpha=0.3)
    for m in methods:
        zoom.scatter([], [], color=colours[m], marker="o", s=30, label=m)
    zoom.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), title="method", title_fontsize=8)
    fig.suptitle(f"Miniature: accuracy vs memory ({results['meta']['n_problems']} problems, test seed "
                 f"{results['meta']['test_seed']}; squares: summaries traces; hollow: variant block size)",
                 fontsize=10)  # fmt: skip
    fig.tight_layout()
    replace_file(path, lambda tmp: fig.savefig(tmp, dpi=130, format="png"))
    plt.close(fig)


def recall_figure(results: dict[str, Any], path: Path) -> None:
    """Per-fact recall by reference distance (tokens between a fact and its recall), one row per arm in the table's
    order, as an annotated heat map: where a policy loses facts (far ones: eviction; near ones: a broken block)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    arms = results["arms"]
    buckets = sorted({b for a in arms for b in a["recall_by_distance"]}, key=_bucket_order)
    values = np.array([[a["recall_by_distance"].get(b, np.nan) for b in buckets] for a in arms], dtype=float)
    fig, ax = plt.subplots(figsize=(6.5, 1.2 + 0.22 * len(arms)))
    image = ax.imshow(values, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
    for (i, j), v in np.ndenumerate(values):
        if not np.isnan(v):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="black" if 0.25 < v < 0.85 else "white")
    ax.set_xticks(range(len(buckets)), [f"distance {b}" for b in buckets], fontsize=8)
    ax.set_yticks(range(len(arms)), [f"{a['name']} ({a['rows_over_full']:.2f})" for a in arms], fontsize=7)
    ax.xaxis.tick_top()
    fig.colorbar(image, ax=ax, fraction=0.04, pad=0.02, label="per-fact recall")
    ax.set_title(f"Recall by reference distance (tokens; arm (rows / full)), {results['meta']['n_problems']} problems, "
                 f"test seed {results['meta']['test_seed']}", fontsize=8, pad=22)  # fmt: skip
    fig.tight_layout()
    replace_file(path, lambda tmp: fig.savefig(tmp, dpi=130, format="png"))
    plt.close(fig)


def _bucket_order(b: str) -> int:
    return {"<64": 0, "64-256": 1, ">256": 2}.get(b, 3)


def write_report(results: dict[str, Any], out: Path) -> None:
    """Every file through a rename: a kill leaves each old or new, never a torn ``results.json`` (the table a merge
    reads: torn, the arms of the earlier runs were lost)."""
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(results)
    write_text_atomic(out / "table.md", text)
    write_csv(results, out / "table.csv")
    write_text_atomic(out / "results.json", json.dumps(results, indent=2))
    pareto_figure(results, out / "pareto.png")
    recall_figure(results, out / "recall_by_distance.png")
    print("\n" + text + f"\nwritten {out}/table.md, table.csv, results.json, pareto.png, recall_by_distance.png")


MATCHED_META = ("test_seed", "n_problems", "trace_tokens")  # what makes two runs' arms comparable
ARM_TEXT = ("name", "method", "paired_with")
ARM_NUMBERS = ("rows_over_full", "answer_accuracy", "delta_vs_full", "recall")


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def arm_problem(arm: Any) -> str | None:
    """Why ``arm`` is not an arm row the table and figures can draw (None when it is one)."""
    if not isinstance(arm, dict):
        return f"an arm is not an object: {json.dumps(arm)[:60]}"
    name = arm.get("name", "?")
    if wrong := [k for k in ARM_TEXT if not isinstance(arm.get(k), str)]:
        return f"arm {name!r}: {', '.join(wrong)} not a string"
    if wrong := [k for k in ARM_NUMBERS if not _number(arm.get(k))]:
        return f"arm {name!r}: {', '.join(wrong)} not a number"
    ci = arm.get("ci_vs_full")
    if not (isinstance(ci, list) and len(ci) == 2 and all(map(_number, ci))):
        return f"arm {name!r}: ci_vs_full={ci!r}, not a [low, high] pair of numbers"
    if not isinstance(arm.get("recall_by_distance"), dict):
        return f"arm {name!r}: recall_by_distance not an object"
    return None


def merge(results: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``results`` with the arms of ``new`` in place of those of the same name (new names appended) and the
    models ``new`` used; refused (``ValueError``) unless both are miniature results on the same problems."""
    for what, r in (("the table", results), ("the rerun", new)):
        if not isinstance(r.get("meta"), dict) or not isinstance(r.get("arms"), list):
            raise ValueError(f"{what} is not a miniature results.json (it needs a 'meta' object and an 'arms' list)")
        if missing := [k for k in MATCHED_META if k not in r["meta"]]:
            raise ValueError(f"{what} is not a miniature results.json (its meta has no {', '.join(missing)})")
        if problem := next(filter(None, map(arm_problem, r["arms"])), None):
            raise ValueError(f"{what} is not a miniature results.json ({problem})")
        names = Counter(a["name"] for a in r["arms"])  # a second row of a name stayed beside the merged one
        if twice := [n for n, count in names.items() if count > 1]:
            raise ValueError(f"{what} is not a miniature results.json (arm {twice[0]!r} is listed {names[twice[0]]} times)")
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
    try:
        new, results = (read_json_object(x, "miniature results.json") for x in paths)
        merged = merge(results, new)
    except ValueError as e:  # a torn or foreign results.json (BadRowError), or runs on other problems
        p.error(str(e))
    write_report(merged, Path(args.into))


if __name__ == "__main__":
    from zoomr.script import run_script

    run_script(main)
