"""Compression vs threshold of the KVzap policy on real prompts, against full KV in the same process.

For each threshold τ, every prompt is decoded (greedy) through :func:`zoomr.engine.generate` with the
KVzap cache; reported per τ: fraction of KV pairs removed after prefill and at the end (mean, min, max over
prompts: the paper's input-adaptivity, §4.7), per layer, and the ratios of resident KV bytes and wall time
to the full-KV arm run on the same prompts.

    python -m analysis.kvzap_compression --model tiny-qwen2 --surrogate runs/kvzap/tiny-qwen2/mlp \\
        --thresholds=-8,-7.9,-7.8 --prompts 32 --max-new-tokens 128     # -> runs/bench/kvzap_compression.json

Prompts are the evaluator's own (MATH-500's user message through the model's chat template, ``eval.math_tasks``).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from analysis.cli import require_at_least
from zoomr.paths import output_file


def math500_prompts(tokenizer, n: int) -> list[list[int]]:
    """The first ``n`` vendored MATH-500 problems as the evaluator prompts them (token ids, generation prompt added)."""
    from eval.benchmarks import load_problems
    from eval.math_tasks import MATH

    return [
        tokenizer(MATH.prompt(problem, tokenizer), add_special_tokens=False).input_ids
        for problem in load_problems(["math500"], limit=n)
    ]


def sweep(
    model, tokenizer, prompts, surrogate, thresholds, *, window=128, max_new_tokens=128, batch_size=8
) -> dict[str, Any]:
    """Run full KV and KVzap at each threshold; return per-threshold aggregates and per-prompt values."""
    from tqdm.auto import tqdm

    from zoomr.cache import build_policy
    from zoomr.cache.kvzap import KVzapCache, KVzapMethod, compression_of
    from zoomr.engine import DecodeSettings, generate

    settings = DecodeSettings(max_new_tokens=max_new_tokens, progress=False, stop_token_ids=[])
    kv_heads = model.config.num_key_value_heads
    batches = range(0, len(prompts), batch_size)
    bar = tqdm(total=len(batches) * (1 + len(thresholds)), desc="kvzap sweep (full, then each tau)", unit="batch")

    def run(make_cache):
        outs, seconds = [], 0.0
        for i in batches:
            t0 = time.perf_counter()
            outs += generate(model, tokenizer, prompts[i : i + batch_size], make_cache(), settings)
            seconds += time.perf_counter() - t0
            bar.update()
        return outs, seconds

    full, full_s = run(lambda: build_policy({"policy": "full"}, model.config, tokenizer))
    full_bytes = np.array([o.stats.kv_bytes[-1] for o in full], dtype=float)
    results = []
    for tau in thresholds:
        cfg = KVzapMethod(threshold=tau, window=window)
        outs, secs = run(lambda cfg=cfg: KVzapCache(cfg, model.config, tokenizer, surrogate=surrogate))
        comp = [compression_of(o, kv_heads) for o in outs]
        total = np.array([c["compression"] for c in comp])
        results.append(
            {
                "threshold": tau,
                "compression_mean": float(total.mean()),
                "compression_min": float(total.min()),
                "compression_max": float(total.max()),
                "prefill_compression_mean": float(np.mean([c["prefill_compression"] for c in comp])),
                "per_layer": np.mean([c["per_layer"] for c in comp], axis=0).round(4).tolist(),
                "kv_bytes_ratio": float(np.mean([o.stats.kv_bytes[-1] for o in outs] / full_bytes)),
                "time_ratio": secs / full_s,
                "same_tokens_as_full": float(
                    np.mean([a.token_ids == b.token_ids for a, b in zip(outs, full)])
                ),
                "per_prompt": total.round(4).tolist(),
            }
        )
    bar.close()
    return {
        "prompts": len(prompts),
        "prompt_tokens_mean": float(np.mean([len(p) for p in prompts])),
        "max_new_tokens": max_new_tokens,
        "window": window,
        "full_seconds": full_s,
        "results": results,
    }


def format_table(report: dict[str, Any]) -> str:
    head = f"{'tau':>8} {'removed':>8} {'min':>6} {'max':>6} {'prefill':>8} {'bytes/full':>10} {'time/full':>9} {'same':>5}"
    lines = [head]
    for r in report["results"]:
        lines.append(
            f"{r['threshold']:>8.3g} {r['compression_mean']:>8.3f} {r['compression_min']:>6.3f} "
            f"{r['compression_max']:>6.3f} {r['prefill_compression_mean']:>8.3f} {r['kv_bytes_ratio']:>10.3f} "
            f"{r['time_ratio']:>9.2f} {r['same_tokens_as_full']:>5.2f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from zoomr.configs import model_config
    from zoomr.kvzap.surrogate import load_surrogate
    from zoomr.models import load_model_and_tokenizer

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-qwen2", help="a conf/model/<name>.yaml")
    p.add_argument("--surrogate", required=True, help="a KVzap checkpoint directory (…/mlp or …/linear)")
    p.add_argument("--thresholds", required=True, help="comma-separated, e.g. -6,-5,-4 (-inf allowed)")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--json", "--out", type=output_file, default="runs/bench/kvzap_compression.json",
                   help="written under the working directory (--out as for the other benches)")  # fmt: skip
    args = p.parse_args(argv)
    require_at_least(p, args, 1, "prompts", "max_new_tokens", "batch_size")
    require_at_least(p, args, 0, "window")
    try:
        thresholds = [float(t) for t in args.thresholds.split(",")]  # "-inf" parses
    except ValueError:
        p.error(f"--thresholds {args.thresholds}: not a comma-separated list of numbers")
    if any(math.isnan(t) for t in thresholds):  # the policy refuses it, but only after the full-KV arm ran
        p.error(f"--thresholds {args.thresholds}: NaN is not a threshold (-inf keeps every row)")
    try:  # before the model loads: a path that is not a surrogate is named, without a traceback
        surrogate = load_surrogate(args.surrogate)
    except (FileNotFoundError, ValueError) as e:
        p.error(f"--surrogate {args.surrogate}: {e}")
    torch.manual_seed(0)
    spec = model_config(args.model)
    model, tok = load_model_and_tokenizer(spec)  # the engine switches to the policy attention
    prompts = math500_prompts(tok, args.prompts)
    report = sweep(
        model, tok, prompts, surrogate, thresholds, window=args.window,
        max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
    )  # fmt: skip
    report.update(model=args.model, surrogate=args.surrogate, threads=torch.get_num_threads())
    print(f"\nKVzap compression on MATH-500 prompts: {args.model}, {args.surrogate}, "
          f"{report['prompts']} prompts (mean {report['prompt_tokens_mean']:.0f} tokens), "
          f"{args.max_new_tokens} new tokens, window {args.window}, {report['threads']} thread(s)")  # fmt: skip
    print(format_table(report))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.json}")
    return report


if __name__ == "__main__":
    from zoomr.script import run_script

    run_script(main)
