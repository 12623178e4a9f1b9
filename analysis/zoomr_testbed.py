"""ZoomR on the recall testbed: accuracy, resident rows, selection hit rate and agreeability vs full KV (table + JSON + plots).

    python -m analysis.zoomr_testbed --model <testbed summaries checkpoint> --n 256 --window 64 --out runs/zoomr_testbed

Arms (greedy, the project's engine, same problems): full KV; ZoomR (k, c, window: the paper's rule); SumR
(consensus 0, every summary); the same two with the model writing its own summaries (``*_writes``: the
checkpoint must have been trained with ``data.model_writes_summaries=true``; the environment still feeds
the facts); optionally ZoomR recomputing at every step; then StreamingLLM and H2O at ZoomR's measured mean
budget (resident rows per layer and KV head, ZoomR paper §4). Grading: the testbed's exact grader (final
``\\boxed{}`` answer and per-fact recall by distance). Every arm runs through the evaluator
(:func:`eval.testbed_task.testbed_arm`, ``benchmark=testbed``); ZoomR's recompute log is read off its
cache after each batch by an ``inspect`` hook and kept in the rows (``row["decode"]``). Intervals: paired bootstrap over problems against
full KV (eval/bootstrap.py, one shared index matrix).

Measured for ZoomR (issue 13): the selection hit rate of the paper's rule at every query's boundary ``:``
(is the defining paragraph in I_c after that recompute?), overall and for facts outside the recent window;
agreeability AG at every recompute (histogram, correct vs incorrect answers); resident rows against
generated length beside the MS formula (:mod:`zoomr.memory_model`) with the testbed's L̄_R and L̄_S; and
how faithfully each arm writes the summary blocks. Finished arms are saved under ``<out>/arms/`` and
reused (``--arms`` runs a subset, e.g. one arm per process).
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from analysis.cli import brief, require_at_least, require_checkpoint, require_testbed_data
from zoomr import tokens
from zoomr.paths import output_dir
from zoomr.testbed.grading import load_test_problems

BASE_ARMS = ("full", "zoomr", "sumr", "zoomr_writes", "sumr_writes", "zoomr_every")
MATCHED = ("streaming", "h2o")


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


def cue_selections(record: dict[str, Any], log: list[dict[str, Any]], prompt_len: int, window: int) -> list[dict[str, Any]]:
    """For every query of ``record``: the recompute at its boundary ``:`` (absolute position prompt_len +
    cue_pos) and whether its I_c holds the paragraph that defined the fact (segment defined_in - 1).
    ``far``: the definition lies outside the ``window`` most recent rows at that recompute."""
    by_pos = {r["position"]: r for r in log}
    out = []
    for q in record["queries"]:
        rec = by_pos.get(prompt_len + q["cue_pos"])
        definition = q["answer_pos"] - q["distance"]
        far = definition < q["cue_pos"] + 1 - window
        if rec is None:  # no recompute at the cue (cannot happen at a boundary token)
            out.append({"hit": False, "far": far, "recomputed": False, "n_summaries": 0})
            continue
        target = q["defined_in"] - 1
        votes = {int(k): n for k, n in rec.get("votes", {}).items()}  # JSON keys come back as strings
        out.append(
            {
                "hit": target in rec["zoomed"],
                "far": far,
                "recomputed": True,
                "n_summaries": rec["n_summaries"],
                "final": q["final"],
                "distance": q["distance"],
                "target_votes": votes.get(target, 0),
                "top_wrong_votes": max((n for i, n in votes.items() if i != target), default=0),
            }
        )
    return out


DISTANCE_BUCKETS = ((0, 128, "<128"), (128, 512, "128-512"), (512, None, ">=512"))  # tokens from definition to answer


def hit_rates(selections: list[list[dict[str, Any]]], consensus: int) -> dict[str, float]:
    """Hit rate overall, for far facts and for the final answer's queries; chance = mean c / (summaries so far)."""
    flat = [s for seq in selections for s in seq]

    def rate(items):
        return float(np.mean([s["hit"] for s in items])) if items else float("nan")

    live = [s for s in flat if s["n_summaries"]]
    misses = [s for s in flat if s["recomputed"] and not s["hit"]]
    return {
        "hit_rate": rate(flat),
        "hit_rate_far": rate([s for s in flat if s["far"]]),
        "hit_rate_final": rate([s for s in flat if s.get("final")]),
        "chance": float(np.mean([min(1.0, consensus / s["n_summaries"]) for s in live])) if live else float("nan"),
        "cues": len(flat),
        "cues_far": sum(s["far"] for s in flat),
        "hit_rate_by_distance": {
            name: rate([s for s in flat if "distance" in s and lo <= s["distance"] and (hi is None or s["distance"] < hi)])
            for lo, hi, name in DISTANCE_BUCKETS
        },
        # how the rule misses: the votes (of L·H·k) the defining summary got, and the most-voted wrong one's
        "miss_votes": {
            key: float(np.mean([s[key] for s in misses])) if misses else float("nan")
            for key in ("target_votes", "top_wrong_votes")
        },
    }


def segment_lengths(records: list[dict[str, Any]]) -> tuple[float, float]:
    """(L̄_R, L̄_S) of the testbed traces as ZoomR's tracker counts them: R_i runs from the token after the
    previous ``<|end_of_summary|>`` to ``<|begin_of_summary|>``; S_i holds both delimiters."""
    reg, summ = [], []
    for r in records:
        start = 0
        for a, b in r["summary_spans"]:
            reg.append(a - 1 - start)
            summ.append(b - a + 2)
            start = b + 1
    return float(np.mean(reg)), float(np.mean(summ))


def rows_vs_length(
    step_rows: list[list[float]], logs: list[list[dict[str, Any]]], records, window: int, consensus: int,
    prompt_len: int, bin_tokens: int = 64,
) -> dict[str, Any]:
    """Measured ZoomR resident rows per generated length (``step_rows``: per sample, the mean rows per layer
    and KV head at every recorded step) beside the MS formula's |I_f| with the testbed's L̄_R, L̄_S and the
    measured |I_all| (voted summaries) of the recomputes in that length bin."""
    from zoomr.memory_model import ZoomRFootprint

    lr, ls = segment_lengths(records)
    width = max(len(r) for r in step_rows)
    total, count = np.zeros(width), np.zeros(width)
    for r in step_rows:
        total[: len(r)] += r
        count[: len(r)] += 1
    measured = total / np.maximum(count, 1)
    bins = list(range(0, width, bin_tokens))
    n_all: dict[int, list[int]] = {b: [] for b in bins}
    for log in logs:
        for rec in log:
            g = rec["position"] - prompt_len
            if 0 <= g < width:
                n_all[(g // bin_tokens) * bin_tokens].append(len(rec["votes"]))
    formula, full, meas = [], [], []
    for b in bins:
        sel = round(float(np.mean(n_all[b]))) if n_all[b] else consensus
        fp = ZoomRFootprint(prompt_len, b + bin_tokens // 2, window, consensus, lr, ls, max(sel, consensus))
        formula.append(fp.resident_rows)
        full.append(fp.full_rows)
        meas.append(float(measured[b : b + bin_tokens][count[b : b + bin_tokens] > 0].mean()))
    return {
        "generated": [b + bin_tokens // 2 for b in bins],
        "zoomr_rows": meas,
        "ms_formula_rows": formula,
        "full_rows": full,
        "mean_regular_len": lr,
        "mean_summary_len": ls,
        "prompt_len": prompt_len,
    }


def zoomr_inspect(keep_rows: bool):
    """The ``inspect`` hook of a ZoomR arm: the testbed's decode stats, the sequence's recompute log (empty
    for other policies) and, with ``keep_rows``, its mean resident rows at every recorded step."""
    from eval.testbed_task import decode_stats

    def inspect(cache, i: int, out) -> dict[str, Any]:
        details = {**decode_stats(cache, i, out), "recomputes": getattr(cache, "recompute_log", {}).get(i, [])}
        if keep_rows:
            details["step_rows"] = out.stats.rows.reshape(len(out.stats.rows), -1).mean(1)
        return details

    return inspect


def run_one(model, tok, data, n: int, cfg, batch: int, window: int, consensus: int, prompt_len: int, keep_rows: bool,
            run_dir: Path) -> dict[str, Any]:  # fmt: skip
    """One arm through the evaluator (:func:`eval.testbed_task.testbed_arm`, resumed from ``run_dir``)."""
    from eval.testbed_task import testbed_arm

    t0 = time.perf_counter()
    records = load_test_problems(data, n)
    rows = testbed_arm(model, tok, data, n, cfg, run_dir, batch, zoomr_inspect(keep_rows)).rows
    logs = [r["decode"]["recomputes"] for r in rows]
    emission = [summary_emission(rec["response"], r["text"]) for rec, r in zip(records, rows)]
    step_s = [r["decode"]["step_s"] for r in rows if r["decode"]["step_s"] is not None]
    out = {
        "config": cfg,
        "answer_accuracy": float(np.mean([r["correct"] for r in rows])),
        "recall": float(np.mean([r["recall_accuracy"] for r in rows])),
        "rows_mean": float(np.mean([r["kv"]["rows_mean"] for r in rows])),
        "step_ms": 1000 * float(np.mean(step_s)),
        "summary_rate": float(np.mean([e["rate"] for e in emission])),
        "summary_placement": float(np.mean([e["placement"] for e in emission])),
        "summary_exact": float(np.mean([e["exact"] for e in emission])),
        "seconds": round(time.perf_counter() - t0, 1),
        "correct": [float(r["correct"]) for r in rows],
        "recalls": [r["recall_accuracy"] for r in rows],
        "ag": [[r["agreeability"] for r in log if r["agreeability"] is not None] for log in logs],
    }
    if cfg.get("policy") == "zoomr" and cfg.get("consensus", 0) > 0:
        sel = [cue_selections(r, log, prompt_len, window) for r, log in zip(records, logs)]
        out["selection"] = hit_rates(sel, consensus)
        out["cue_ag"] = [
            [rec["agreeability"] for rec in log if rec["position"] - prompt_len in {q["cue_pos"] for q in r["queries"]}]
            for r, log in zip(records, logs)
        ]
        out["cue_hits"] = [[s["hit"] for s in seq] for seq in sel]
        if keep_rows:
            step_rows = [r["decode"]["step_rows"] for r in rows]
            out["rows_vs_length"] = rows_vs_length(step_rows, logs, records, window, consensus, prompt_len)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a trained testbed checkpoint directory (with summaries)")
    p.add_argument("--n", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--trace-tokens", type=int, default=None, help="default: the length the model was trained at")
    p.add_argument("--test-seed", type=int, default=None, help="default: the data's test seed")
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--consensus", type=int, default=2)
    p.add_argument("--arms", nargs="+", default=None, choices=[*BASE_ARMS, *MATCHED],
                   help="run only these arms (default: all but zoomr_every; *_writes only for a model trained to write summaries)")  # fmt: skip
    p.add_argument("--out", type=output_dir, default="runs/zoomr_testbed")
    args = p.parse_args(argv)
    require_at_least(p, args, 1, "n", "batch", "top_k", "trace_tokens")
    require_at_least(p, args, 0, "window", "consensus")
    require_checkpoint(p, args.model)
    trained = require_testbed_data(p, args.model, trace_tokens=args.trace_tokens, test_seed=args.test_seed)

    from analysis.testbed_table import cached
    from eval.bootstrap import index_matrix, paired_bootstrap
    from zoomr.cache import match_budget
    from zoomr.testbed import vocab as tt
    from zoomr.testbed.checkpoint import load_testbed_model

    out_dir = Path(args.out)
    (out_dir / "arms").mkdir(parents=True, exist_ok=True)
    model, tok = load_testbed_model(args.model, attn_implementation="zoomr")
    if not trained.summaries:
        raise SystemExit(f"{args.model} was trained without summaries: ZoomR needs the summaries model")
    writes = trained.model_writes_summaries
    wanted = args.arms or [a for a in (*BASE_ARMS, *MATCHED) if a != "zoomr_every" and (writes or not a.endswith("_writes"))]
    if not writes and any(a.endswith("_writes") for a in wanted):
        raise SystemExit(f"{args.model} was not trained to write summaries (data.model_writes_summaries=false)")
    env_data = replace(trained, model_writes_summaries=False)
    datas = {"env": env_data, "model": trained}  # who writes the summaries: the environment or the model
    env_records = load_test_problems(env_data, args.n)
    prompt_len = len(tt.FastEncoder(tok).prompt(env_records[0]["prompt"].split()))
    zoomr_cfg = {"policy": "zoomr", "top_k": args.top_k, "consensus": args.consensus, "window": args.window}
    sumr_cfg = {**zoomr_cfg, "consensus": 0, "summaries": "all"}
    plan = {
        "full": ({"policy": "full"}, "env"),
        "zoomr": (zoomr_cfg, "env"),
        "sumr": (sumr_cfg, "env"),
        "zoomr_writes": (zoomr_cfg, "model"),
        "sumr_writes": (sumr_cfg, "model"),
        "zoomr_every": ({**zoomr_cfg, "recompute": "every"}, "env"),
    }
    results: dict[str, dict] = {}
    base = {"model": str(Path(args.model).resolve()), "data": asdict(env_data), "n": args.n}

    def arm(name: str, cfg: dict[str, Any], which: str) -> dict[str, Any]:
        key = {**base, "policy": cfg, "summaries_by": which}
        compute = functools.partial(run_one, model, tok, datas[which], args.n, cfg, args.batch, args.window,
                                    args.consensus, prompt_len, name == "zoomr")  # fmt: skip
        r = cached(out_dir / "arms" / f"{name}.json", key, compute)
        print(name, brief({k: v for k, v in r.items() if isinstance(v, float | int) or k == "selection"}), flush=True)
        return r

    for name in [a for a in BASE_ARMS if a in wanted or a in ("full", "zoomr") and any(m in wanted for m in MATCHED)]:
        results[name] = arm(name, *plan[name])
    for name in [m for m in MATCHED if m in wanted]:  # baselines at ZoomR's measured mean budget
        budget = results["zoomr"]["rows_mean"]
        cfg = vars(match_budget({"policy": name, "budget_rows": 1024, **({"n_sink": 4} if name == "streaming" else {})}, budget))
        results[name] = arm(name, cfg, "env")
    if "full" in results:
        idx = index_matrix(len(env_records))
        full = results["full"]
        for r in results.values():
            for metric, field in (("correct", "correct"), ("recall", "recalls")):
                ci = paired_bootstrap(np.array(r[field]), np.array(full[field]), idx)
                r[f"{metric}_vs_full"] = {"delta": ci.delta, "low": ci.low, "high": ci.high}
            r["rows_over_full"] = r["rows_mean"] / full["rows_mean"]
            r["step_time_ratio"] = r["step_ms"] / full["step_ms"]
        text = table(results)
    else:  # the arms' results are still written (the selection hit rate needs no reference arm)
        text = "no full-KV arm among --arms: no comparison table (add full to --arms for it)"
    print("\n" + text)
    figures = []
    if "zoomr" in results:
        plot_ag(results["zoomr"], out_dir / "ag_hist.png")
        figures.append("ag_hist.png")
        if "rows_vs_length" in results["zoomr"]:
            plot_rows(results["zoomr"]["rows_vs_length"], out_dir / "rows_vs_length.png")
            figures.append("rows_vs_length.png")
    meta = {**vars(args), "threads": torch.get_num_threads(), "problems": len(env_records), "data": asdict(env_data)}
    slim = {n: {k: v for k, v in r.items() if k not in ("ag", "cue_ag", "cue_hits", "key")} for n, r in results.items()}
    (out_dir / "results.json").write_text(json.dumps({"meta": meta, "results": slim}, indent=2))
    (out_dir / "table.md").write_text(text + "\n")
    for name, r in results.items():  # AG of every recompute, for paper_tables' AG histogram
        if r.get("config", {}).get("policy") == "zoomr":
            ag = {"arm": name, "agreeability": [x for seq in r["ag"] for x in seq],
                  "agreeability_at_cues": [x for seq in r.get("cue_ag", []) for x in seq], "meta": meta}  # fmt: skip
            (out_dir / f"agreeability_{name}.json").write_text(json.dumps(ag))
    print(f"\nwritten {out_dir / 'results.json'}, {out_dir / 'table.md'}, " + ", ".join(str(out_dir / f) for f in figures))
    return results


def table(results: dict[str, dict[str, Any]]) -> str:
    head = ("| arm | rows/full | answer acc | Δ vs full [95% CI] | recall | Δ recall [95% CI] | hit rate (far) "
            "| summaries exact | step × |")  # fmt: skip
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, r in results.items():
        c, q = r["correct_vs_full"], r["recall_vs_full"]
        sel = r.get("selection")
        hit = f"{sel['hit_rate']:.3f} ({sel['hit_rate_far']:.3f}; chance {sel['chance']:.2f})" if sel else "–"
        lines.append(
            f"| {name} | {r['rows_over_full']:.3f} | {r['answer_accuracy']:.3f} | {c['delta']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}] "
            f"| {r['recall']:.3f} | {q['delta']:+.3f} [{q['low']:+.3f}, {q['high']:+.3f}] | {hit} | {r['summary_exact']:.3f} "
            f"| {r['step_time_ratio']:.2f} |"
        )
    return "\n".join(lines)


def plot_ag(arm: dict[str, Any], path: Path) -> None:
    """AG per recompute: histogram over every recompute (correct vs incorrect answers) and at the query cues."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    bins = np.linspace(0, 1, 21)
    for label, want, color in (("correct", 1.0, "tab:green"), ("incorrect", 0.0, "tab:red")):
        vals = [x for a, c in zip(arm["ag"], arm["correct"]) if c == want for x in a]
        if vals:
            axes[0].hist(vals, bins=bins, alpha=0.5, color=color, density=True, label=f"{label} answers ({len(vals)} recomputes)")
    axes[0].set_title("every recompute")
    if "cue_ag" in arm:
        for label, want, color in (("hit", True, "tab:blue"), ("miss", False, "tab:orange")):
            vals = [x for ag, hits in zip(arm["cue_ag"], arm["cue_hits"]) for x, h in zip(ag, hits) if h == want and x is not None]
            if vals:
                axes[1].hist(vals, bins=bins, alpha=0.5, color=color, density=True, label=f"{label} ({len(vals)} cues)")
    axes[1].set_title("at the query boundaries ':'")
    for ax in axes:
        ax.set_xlabel("agreeability AG")
        ax.legend(fontsize=8)
    axes[0].set_ylabel("density")
    fig.suptitle("ZoomR consensus on the recall testbed")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_rows(rv: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(rv["generated"], rv["full_rows"], label="full KV", color="black")
    ax.plot(rv["generated"], rv["zoomr_rows"], label="ZoomR measured |I_f|", color="tab:blue")
    ax.plot(rv["generated"], rv["ms_formula_rows"], "--", color="tab:orange",
            label=f"MS formula (L̄_R={rv['mean_regular_len']:.0f}, L̄_S={rv['mean_summary_len']:.1f})")  # fmt: skip
    ax.set_xlabel("generated tokens")
    ax.set_ylabel("resident rows per layer and KV head")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    from zoomr.script import run_script

    run_script(main)
