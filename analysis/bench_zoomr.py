"""Resident rows and decode step time of ZoomR vs full KV on a summary-structured stream (table + JSON).

    python -m analysis.bench_zoomr --prompt 512 --generate 4096 --para 250 --summary 20 --window 512

A tiny random-weight model is teacher-forced through a token stream shaped like a ZoomR generation
(prompt, then paragraphs of ``--para`` tokens each closed by a ``--summary``-token summary; the last
token of each paragraph is ``.``, a semantic boundary). Arms: full KV, ZoomR with offload, ZoomR on the
device. Per arm: rows resident per (layer, KV head) at the end and on average, and the mean decode-step
time (median; arms run in lockstep, step by step). The measured saving is compared with the paper's formula (ZoomR §3.5) fed the measured
|I_all|. All arms run in this process, one after another, with the same thread count.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from analysis.cli import require_at_least
from zoomr import tokens
from zoomr.cache import build_policy
from zoomr.memory_model import ZoomRFootprint, memory_saving
from zoomr.models import load_model_and_tokenizer
from zoomr.paths import output_file
from zoomr.segments import boundary_table


def structured_stream(tokenizer, n_prompt: int, n_gen: int, para: int, summ: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    table = boundary_table(tokenizer)
    plain = torch.tensor([i for i in range(200, 4000) if not table[i]])
    fill = lambda n: plain[torch.randint(len(plain), (n,), generator=g)].tolist()  # noqa: E731
    dot = tokenizer.convert_tokens_to_ids(".")
    b, e = (tokenizer.convert_tokens_to_ids(t) for t in tokens.SUMMARY_TAGS)
    ids = fill(n_prompt)
    while len(ids) < n_prompt + n_gen + 1:
        ids += fill(para - 1) + [dot, b] + fill(summ - 2) + [e]
    return ids[: n_prompt + n_gen + 1]


@torch.no_grad()
def run_arms(model, caches: dict, ids: list[int], n_prompt: int) -> dict[str, dict]:
    """Teacher-force every arm through the same stream in lockstep (step t of every arm back to back),
    so machine noise hits all arms alike; time each arm's decode forwards."""
    x = torch.tensor([ids])
    for cache in caches.values():
        step = cache.begin_step(torch.ones(1, n_prompt, dtype=torch.bool), input_ids=x[:, :n_prompt])
        model(x[:, :n_prompt], cache=cache, use_cache=True, position_ids=step.positions)
        cache.end_step()
    times = {k: [] for k in caches}
    rows = {k: [] for k in caches}
    bar = tqdm(range(n_prompt, len(ids) - 1), desc=f"bench_zoomr ({len(caches)} arms in lockstep)", unit="step")
    for t in bar:  # the bar advances outside the timed spans
        for name, cache in caches.items():
            step = cache.begin_step(torch.ones(1, 1, dtype=torch.bool), input_ids=x[:, t : t + 1])
            t0 = time.perf_counter()
            model(x[:, t : t + 1], cache=cache, use_cache=True, position_ids=step.positions)
            cache.end_step()
            times[name].append(time.perf_counter() - t0)
            rows[name].append(float(cache.resident_rows().float().mean()))
    out = {}
    for name, cache in caches.items():
        held = cache.resident_bytes()
        ts = np.asarray(times[name][len(times[name]) // 10 :])  # skip the warm-up tenth
        out[name] = {
            "rows_final": rows[name][-1],
            "rows_mean": float(np.mean(rows[name])),
            "step_ms": 1000 * float(np.median(ts)),
            "step_ms_last_quarter": 1000 * float(np.median(ts[-len(ts) // 4 :])),
            "device_bytes": held["device"],
            "host_bytes": held["host"],
        }
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--generate", type=int, default=4096)
    p.add_argument("--para", type=int, default=250)
    p.add_argument("--summary", type=int, default=20)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--consensus", type=int, default=2)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--out", type=output_file, default="runs/bench/zoomr_rows.json")
    args = p.parse_args(argv)
    require_at_least(p, args, 1, "prompt", "generate", "para", "top_k", "layers")
    require_at_least(p, args, 2, "summary")  # its two delimiters; 1 was a RuntimeError traceback after the model loaded
    require_at_least(p, args, 0, "window", "consensus")
    if args.generate <= args.para + args.summary:
        p.error(f"--generate {args.generate} must exceed one paragraph and its summary ({args.para} + {args.summary})")
    torch.manual_seed(0)
    from zoomr.models import tiny_spec

    model, tok = load_model_and_tokenizer(
        tiny_spec("qwen2", num_hidden_layers=args.layers), attn_implementation="zoomr"
    )
    ids = structured_stream(tok, args.prompt, args.generate, args.para, args.summary)
    zcfg = {"policy": "zoomr", "top_k": args.top_k, "consensus": args.consensus, "window": args.window}
    arms = {
        "full": {"policy": "full"},
        "zoomr_offload": {**zcfg, "offload": True},
        "zoomr_device": {**zcfg, "offload": False},
    }
    caches = {name: build_policy(cfg, model.config, tok) for name, cfg in arms.items()}
    results = run_arms(model, caches, ids, args.prompt)
    log = caches["zoomr_offload"].recompute_log[0]
    last = log[-1]
    footprint = ZoomRFootprint(
        args.prompt, last["position"] + 1 - args.prompt, args.window, args.consensus, args.para, args.summary,
        max(len(last["votes"]), args.consensus),
    )  # fmt: skip
    formula = {
        "resident_rows": footprint.resident_rows,
        "ms": memory_saving(footprint),
        "n_all": len(last["votes"]),
    }
    measured = {"resident_rows": last["rows"], "ms": footprint.full_rows / last["rows"]}
    full = results["full"]
    header = (
        f"{'arm':<15}{'rows final':>12}{'rows mean':>11}{'full/arm':>10}{'step ms':>9}{'time ratio':>11}"
        f"{'late ratio':>11}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for name, r in results.items():
        r["rows_ratio_final"] = full["rows_final"] / r["rows_final"]
        r["step_time_ratio"] = r["step_ms"] / full["step_ms"]
        r["late_step_time_ratio"] = r["step_ms_last_quarter"] / full["step_ms_last_quarter"]
        print(
            f"{name:<15}{r['rows_final']:>12.0f}{r['rows_mean']:>11.1f}{r['rows_ratio_final']:>10.2f}"
            f"{r['step_ms']:>9.2f}{r['step_time_ratio']:>11.2f}{r['late_step_time_ratio']:>11.2f}"
        )
    summary = caches["zoomr_offload"].summary()
    ag = summary["mean_agreeability"]
    ag_text = (
        f"{ag:.3f}"
        if ag == ag  # NaN: no recompute had a summary to vote on
        else "n/a (no recompute had a summary to vote on yet: generate more tokens or use shorter --para)"
    )
    gap = summary["tokens_between_recomputes"]
    every = f", every {gap:.1f} tokens" if gap == gap else ""  # NaN: a single recompute
    print(
        f"\nrecomputes {summary['recomputes']}{every}, "
        f"mean AG {ag_text}. At the last recompute (t = {last['position'] + 1}): "
        f"|I_all| = {formula['n_all']}, |I_f| = {measured['resident_rows']} rows (saving {measured['ms']:.2f}x); "
        f"the paper's formula with these inputs: {formula['resident_rows']:.0f} rows ({formula['ms']:.2f}x). "
        "Between recomputes the rows generated since are appended, hence 'rows final' above."
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {**vars(args), "threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS")}
    out.write_text(
        json.dumps(
            {"meta": meta, "results": results, "zoomr": summary, "formula": formula, "measured": measured,
             "agreeability": [r["agreeability"] for r in log]},  # per recompute (paper_tables: AG histogram)
            indent=2,
        )
    )
    print(f"written {out}")


if __name__ == "__main__":
    from zoomr.script import run_script

    run_script(main)
