"""LightThinker serving benchmark: the ``lightthinker`` policy vs full KV, in one process, per trace length.

    python -m analysis.bench_lightthinker [--model tiny-qwen2] [--lengths 1024 4096] [--thought-tokens 64]
                                          [--num-cache-tokens N] [--batch 1] [--repeats 2] [--out FILE]

Every response token is written by an engine script (random ids, a ``<|splitter|>`` after every
``--thought-tokens`` tokens), so both arms decode the same trace one step at a time and LightThinker
compresses each thought exactly as it would a model-written one (forced ``n`` cache tokens + continue,
thought freed). Reported per length: median and mean decode-step time ÷ full KV's (the mean counts the
forwards that run the cache tokens; best of ``--repeats`` interleaved runs: the machine is shared), mean
and final resident rows ÷ full KV's, peak K/V bytes ÷ full KV's, and the rows the layout predicts at the
end (prompt + thoughts × (n + 1) + the open thought). Prints a table and writes JSON (default
``runs/bench_lightthinker/bench-<model>-<time>.json``).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import torch

from analysis.bench_decode import check_conf_names, model_spec
from analysis.cli import require_at_least, require_device, write_bench_json
from zoomr import tokens
from zoomr.cache.lightthinker import LightThinkerCache, LightThinkerMethod, resolve_cache_tokens
from zoomr.engine import DecodeSettings, generate
from zoomr.models import load_model_and_tokenizer
from zoomr.paths import output_file


def trace_script(length: int, thought: int, splitter: int, seed: int) -> list[int]:
    """``length`` random response ids with a splitter closing every ``thought`` tokens."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(50, 4000, (length,), generator=gen).tolist()
    for t in range(thought - 1, length - 1, thought):
        ids[t] = splitter
    return ids


def measure(model, tok, policy, prompts, scripts, length: int) -> dict[str, Any]:
    settings = DecodeSettings(max_new_tokens=length, stop_token_ids=[], progress=False)
    t0 = time.perf_counter()
    outs = generate(model, tok, prompts, policy, settings, script=scripts)
    wall = time.perf_counter() - t0
    steps = np.asarray(outs[0].stats.step_s[1:])
    return {
        "wall_s": wall,
        "step_median_s": float(np.median(steps)),
        "step_mean_s": float(steps.mean()),
        "mean_rows": float(np.mean([o.stats.mean_rows for o in outs])),
        "final_rows": float(np.mean([o.stats.rows[-1].mean() for o in outs])),
        "peak_kv_bytes": int(max(o.stats.kv_bytes.max() for o in outs)),
        "forced_tokens": int(sum(o.n_forced for o in outs)),
    }


@torch.no_grad()
def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    model, tok = load_model_and_tokenizer(model_spec(args.model), args.cache_dir, device=args.device)
    model.eval()
    # scripted splitters: the mechanics of serving, so an untrained model is fine here
    method = LightThinkerMethod(num_cache_tokens=args.num_cache_tokens, allow_untrained=True)
    n = resolve_cache_tokens(method, model.config)
    splitter = tok.convert_tokens_to_ids(tokens.SPLITTER)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(50, 4000, (args.prompt_tokens,), generator=gen).tolist() for _ in range(args.batch)]
    results = []
    for length in args.lengths:
        scripts = [trace_script(length, args.thought_tokens, splitter, seed=b) for b in range(args.batch)]
        best: dict[str, dict[str, Any]] = {}
        for _ in range(args.repeats):  # interleaved; the fastest counts (the machine is shared)
            for name in ("full", "lightthinker"):
                policy = (
                    {"policy": "full"}
                    if name == "full"
                    else LightThinkerCache(LightThinkerMethod(), model.config, tok, num_cache_tokens=n)
                )
                r = measure(model, tok, policy, prompts, scripts, length)
                if name not in best or r["step_median_s"] < best[name]["step_median_s"]:
                    best[name] = r
            print(f"  length {length}: best so far full {best['full']['wall_s']:.1f} s, lightthinker "
                  f"{best['lightthinker']['wall_s']:.1f} s", flush=True)  # fmt: skip
        full, lt = best["full"], best["lightthinker"]
        thoughts = (length - 1) // args.thought_tokens  # splitters followed by more tokens
        open_raw = (length - 1) - thoughts * args.thought_tokens  # fed tokens of the open thought
        results.append({
            "length": length, "thoughts": thoughts, "full": full, "lightthinker": lt,
            "predicted_final_rows": args.prompt_tokens + thoughts * (n + 1) + open_raw,
            "step_median_ratio": lt["step_median_s"] / full["step_median_s"],
            "step_mean_ratio": lt["step_mean_s"] / full["step_mean_s"],
            "mean_rows_ratio": lt["mean_rows"] / full["mean_rows"],
            "final_rows_ratio": lt["final_rows"] / full["final_rows"],
            "peak_bytes_ratio": lt["peak_kv_bytes"] / full["peak_kv_bytes"],
        })  # fmt: skip
    return {
        "model": args.model, "device": str(next(model.parameters()).device), "threads": torch.get_num_threads(),
        "num_cache_tokens": n, "thought_tokens": args.thought_tokens, "prompt_tokens": args.prompt_tokens,
        "batch": args.batch, "repeats": args.repeats, "results": results,
    }  # fmt: skip


def table(report: dict[str, Any]) -> str:
    head = (
        f"model {report['model']} on {report['device']}, {report['threads']} thread(s), batch {report['batch']}, "
        f"n = {report['num_cache_tokens']} cache tokens per {report['thought_tokens']}-token thought, "
        f"{report['prompt_tokens']}-token prompt, best of {report['repeats']}; ratios = lightthinker ÷ full KV"
    )
    lines = [head, "", "| length | thoughts | step median ÷ full | step mean ÷ full | mean rows ÷ full | "
             "final rows (predicted) | final rows ÷ full | peak bytes ÷ full |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in report["results"]:
        lines.append(
            f"| {r['length']} | {r['thoughts']} | {r['step_median_ratio']:.2f} | {r['step_mean_ratio']:.2f} | "
            f"{r['mean_rows_ratio']:.3f} | {r['lightthinker']['final_rows']:.0f} ({r['predicted_final_rows']}) | "
            f"{r['final_rows_ratio']:.3f} | {r['peak_bytes_ratio']:.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny-qwen2", help="a conf/model/<name>.yaml")
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--thought-tokens", type=int, default=64)
    p.add_argument("--num-cache-tokens", type=int, default=None, help="default: the paper's n for the model")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--out", type=output_file, default=None)
    args = p.parse_args(argv)
    if args.thought_tokens < 2:
        p.error("--thought-tokens must be >= 2 (a thought needs a token besides its splitter)")
    require_at_least(p, args, 1, "lengths", "num_cache_tokens", "prompt_tokens", "batch", "repeats", "threads")
    check_conf_names(p, [], args.model)
    require_device(p, args.device)
    report = run(args)
    write_bench_json(args.out, "bench_lightthinker", args.model, report, table(report))
    return report


if __name__ == "__main__":
    from zoomr.script import run_script

    run_script(main)
