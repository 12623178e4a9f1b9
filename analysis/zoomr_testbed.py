"""ZoomR on the recall testbed: accuracy, resident rows, step time and agreeability vs full KV (table + JSON + plot).

    python -m analysis.zoomr_testbed --model <testbed checkpoint dir> --n 64 --window 64 --out runs/zoomr_testbed

Arms (greedy, the project's engine, same batches): full KV; ZoomR (k, c, window); SumR (consensus 0, every
summary); optionally ZoomR recomputing at every step; then StreamingLLM and H2O at ZoomR's measured mean
budget (resident rows per layer and KV head, ZoomR paper §4). Grading: the testbed's exact grader (final
``\\boxed{}`` answer and per-fact recall by distance). Intervals: paired bootstrap over problems against
full KV (eval/bootstrap.py, one shared index matrix). AG over recompute steps for correct vs incorrect
answers is plotted (ZoomR Fig. 3d). Also reported: how faithfully each arm writes the summary blocks.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zoomr import tokens


def summary_blocks(text: str) -> list[str]:
    """The summary contents of a response, in order (delimiters stripped, whitespace-normalised)."""
    out, rest = [], text
    while tokens.BEGIN_SUMMARY in rest:
        rest = rest.split(tokens.BEGIN_SUMMARY, 1)[1]
        body, sep, rest = rest.partition(tokens.END_SUMMARY)
        if not sep:
            break
        out.append(" ".join(body.split()))
    return out


def summary_emission(reference: str, generated: str) -> dict[str, float]:
    """Rate (summaries written / summaries in the reference), placement (each block closes a paragraph:
    followed by a blank line or the answer) and exactness (block i equals the reference's block i)."""
    ref, gen = summary_blocks(reference), summary_blocks(generated)
    placed = 0
    for part in generated.split(tokens.END_SUMMARY)[1 : len(gen) + 1]:
        nxt = part.lstrip(" ")
        placed += nxt.startswith("\n\n") or nxt.startswith("\\boxed") or not nxt.strip()
    exact = sum(a == b for a, b in zip(ref, gen))
    return {
        "rate": len(gen) / max(len(ref), 1),
        "placement": placed / max(len(gen), 1),
        "exact": exact / max(len(ref), 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a trained testbed checkpoint directory")
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--trace-tokens", type=int, default=None, help="default: the length the model was trained at")
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--consensus", type=int, default=2)
    p.add_argument("--every", action="store_true", help="also run ZoomR recomputing at every step")
    p.add_argument("--out", default="runs/zoomr_testbed")
    args = p.parse_args()

    from analysis.testbed_arms import load_testbed_model, run_arm, test_records, trained_data
    from eval.bootstrap import index_matrix, paired_bootstrap
    from zoomr.cache import match_budget
    from zoomr.engine import mean_rows

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    model, tok = load_testbed_model(args.model, attn_implementation="zoomr")
    data = trained_data(args.model, trace_tokens=args.trace_tokens)
    if not data.summaries:
        raise SystemExit(f"{args.model} was trained without summaries: ZoomR needs the summaries model")
    records = test_records(data, args.n)
    zoomr_cfg = {"policy": "zoomr", "top_k": args.top_k, "consensus": args.consensus, "window": args.window}
    arms: dict[str, dict] = {
        "full": {"policy": "full"},
        "zoomr": zoomr_cfg,
        "sumr": {**zoomr_cfg, "consensus": 0, "summaries": "all"},
    }
    if args.every:
        arms["zoomr_every"] = {**zoomr_cfg, "recompute": "every"}
    results: dict[str, dict] = {}
    for name, cfg in list(arms.items()) + [("streaming", None), ("h2o", None)]:
        if cfg is None:  # baselines at ZoomR's measured mean budget
            budget = results["zoomr"]["rows_mean"]
            base = {"policy": name, "budget_rows": 1024, **({"n_sink": 4} if name == "streaming" else {})}
            cfg = vars(match_budget(base, budget))
        t0 = time.perf_counter()
        outs, grades, caches = run_arm(model, tok, records, cfg, args.batch)
        logs = [
            getattr(c, "recompute_log", {}).get(j, []) for c, n in zip(caches, _chunk_sizes(len(records), args.batch))
            for j in range(n)
        ]
        emission = [summary_emission(r["response"], o.text) for r, o in zip(records, outs)]
        step_s = [float(np.mean(o.stats.step_s[1:])) for o in outs if len(o.stats.step_s) > 1]
        results[name] = {
            "config": cfg,
            "answer_accuracy": float(np.mean([g["correct"] for g in grades])),
            "recall": float(np.mean([g["recall_accuracy"] for g in grades])),
            "rows_mean": mean_rows(outs),
            "step_ms": 1000 * float(np.mean(step_s)),
            "summary_rate": float(np.mean([e["rate"] for e in emission])),
            "summary_placement": float(np.mean([e["placement"] for e in emission])),
            "summary_exact": float(np.mean([e["exact"] for e in emission])),
            "seconds": round(time.perf_counter() - t0, 1),
            "_correct": [float(g["correct"]) for g in grades],
            "_recall": [g["recall_accuracy"] for g in grades],
            "_ag": [[r["agreeability"] for r in log if r["agreeability"] is not None] for log in logs],
        }
        print(name, {k: v for k, v in results[name].items() if not k.startswith("_")}, flush=True)

    idx = index_matrix(len(records))
    full = results["full"]
    for r in results.values():
        for metric in ("correct", "recall"):
            ci = paired_bootstrap(np.array(r[f"_{metric}"]), np.array(full[f"_{metric}"]), idx)
            r[f"{metric}_vs_full"] = {"delta": ci.delta, "low": ci.low, "high": ci.high}
        r["rows_full_over_arm"] = full["rows_mean"] / r["rows_mean"]
        r["step_time_ratio"] = r["step_ms"] / full["step_ms"]

    header = (
        f"{'arm':<12}{'answer':>8}{'Δ vs full [95% CI]':>24}{'recall':>8}{'Δ recall [95% CI]':>24}"
        f"{'rows':>8}{'full/arm':>9}{'step×':>7}{'summ rate':>10}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for name, r in results.items():
        c, q = r["correct_vs_full"], r["recall_vs_full"]
        print(
            f"{name:<12}{r['answer_accuracy']:>8.3f}"
            f"{c['delta']:>+8.3f} [{c['low']:+.3f},{c['high']:+.3f}]{r['recall']:>8.3f}"
            f"{q['delta']:>+8.3f} [{q['low']:+.3f},{q['high']:+.3f}]"
            f"{r['rows_mean']:>8.1f}{r['rows_full_over_arm']:>9.2f}{r['step_time_ratio']:>7.2f}{r['summary_rate']:>10.2f}"
        )
    ag = ag_by_outcome(results["zoomr"])
    plot_ag(ag, out_dir / "ag_correct_vs_incorrect.png")
    meta = {**vars(args), "threads": torch.get_num_threads(), "problems": len(records)}
    (out_dir / "results.json").write_text(json.dumps({"meta": meta, "results": results, "ag": ag}, indent=2))
    print(f"\nwritten {out_dir / 'results.json'} and {out_dir / 'ag_correct_vs_incorrect.png'}")


def _chunk_sizes(n: int, batch: int) -> list[int]:
    return [min(batch, n - i) for i in range(0, n, batch)]


def ag_by_outcome(arm: dict) -> dict[str, Any]:
    """Mean and standard deviation of AG at each recompute index, for correct and incorrect answers."""
    out: dict[str, Any] = {}
    for label, want in (("correct", 1.0), ("incorrect", 0.0)):
        seqs = [a for a, c in zip(arm["_ag"], arm["_correct"]) if c == want and a]
        width = max((len(a) for a in seqs), default=0)
        mean, std, count = [], [], []
        for t in range(width):
            vals = [a[t] for a in seqs if len(a) > t]
            mean.append(float(np.mean(vals)))
            std.append(float(np.std(vals)))
            count.append(len(vals))
        flat = [x for a in seqs for x in a]
        out[label] = {
            "sequences": len(seqs),
            "mean": mean,
            "std": std,
            "count": count,
            "overall_mean": float(np.mean(flat)) if flat else float("nan"),
            "overall_std": float(np.std(flat)) if flat else float("nan"),
        }
    return out


def plot_ag(ag: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for label, color in (("correct", "tab:green"), ("incorrect", "tab:red")):
        d = ag[label]
        if not d["mean"]:
            continue
        x = np.arange(1, len(d["mean"]) + 1)
        m, s = np.array(d["mean"]), np.array(d["std"])
        ax.plot(x, m, color=color, label=f"{label} ({d['sequences']} answers)")
        ax.fill_between(x, m - s, m + s, color=color, alpha=0.15)
    ax.set_xlabel("recompute step")
    ax.set_ylabel("agreeability AG")
    ax.set_title("ZoomR consensus on the recall testbed")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
