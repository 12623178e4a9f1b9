"""Decode benchmark: every cache policy vs full KV, in one process, at several context lengths.

    python -m analysis.bench_decode [--model tiny-qwen2] [--contexts 1024 4096 8192] [--decode-steps 32]
                                    [--budget 512] [--context-mode generated|prompt] [--threads 1] [--out FILE]

For each context C the cache is filled with C random tokens: by default (``generated``) a short prompt
(``--prompt-tokens``) and the rest fed as generation-phase chunks of ``--prefill-chunk`` tokens (so decode-time
policies compress it as they would a long reasoning trace; SnapKV, a prefill method, then keeps it all);
``prompt`` prefills all C tokens. Then ``--decode-steps`` greedy steps are timed (the model forward with the
cache's work inside it). Reported per policy: median step time ÷ full KV's (best of ``--repeats`` interleaved
runs: the machine is shared), mean resident rows ÷ full KV's, bytes held (measured from the tensors the cache
holds, device + host) ÷ full KV's, and the share of step time spent selecting. ``hf_dynamic`` is
transformers' own ``DynamicCache`` + SDPA in the same loop, for scale. Budgeted policies get
``budget_rows = --budget``; other hyperparameters come from ``conf/method/<name>.yaml``.
Prints a table and writes JSON (default ``runs/bench_decode/bench-<model>-<time>.json``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from zoomr.cache import build_policy, policy_config
from zoomr.models import load_model_and_tokenizer, spec_from_dict
from zoomr.paths import REPO_ROOT

POLICIES = [
    "full", "offload", "streaming", "h2o", "snapkv", "rkv", "rkv_serving",
    "evict_recency", "evict_random", "evict_attention",
]  # fmt: skip


def method_config(name: str, budget: int) -> Any:
    raw = OmegaConf.to_container(OmegaConf.load(REPO_ROOT / "conf" / "method" / f"{name}.yaml"), resolve=True)
    raw.pop("defaults", None)
    cfg = policy_config(raw)
    if getattr(cfg, "budget_rows", None) is not None:
        cfg = policy_config({**raw, "budget_rows": budget})
    return cfg


def model_spec(name: str):
    raw = OmegaConf.to_container(OmegaConf.load(REPO_ROOT / "conf" / "model" / f"{name}.yaml"), resolve=True)
    raw.pop("defaults", None)
    return spec_from_dict(raw)


@torch.no_grad()
def hf_dynamic(model, ids: torch.Tensor, steps: int, chunk: int) -> float:
    """Median decode-step time of transformers' DynamicCache + SDPA (greedy, plain loop)."""
    from transformers import DynamicCache

    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    cache = DynamicCache(config=model.config)
    for s in range(0, ids.shape[1], chunk):
        logits = model(ids[:, s : s + chunk], cache=cache, use_cache=True, logits_to_keep=1).logits
    tok, times = logits[:, -1:].argmax(-1), []
    for _ in range(steps):
        t0 = time.perf_counter()
        logits = model(tok, cache=cache, use_cache=True).logits
        times.append(time.perf_counter() - t0)
        tok = logits[:, -1:].argmax(-1)
    model.set_attn_implementation(previous)
    return statistics.median(times)


@torch.no_grad()
def measure(model, cfg: Any, ids: torch.Tensor, args: argparse.Namespace) -> dict[str, Any]:
    """Fill the cache with ``ids`` (prompt + generation-phase chunks, or all prompt), then time greedy steps."""
    cache = build_policy(cfg, model.config)
    sync = torch.cuda.synchronize if ids.device.type == "cuda" else (lambda: None)

    def feed(x: torch.Tensor, prefill: bool, last: bool = False):
        step = cache.begin_step(
            torch.ones_like(x, dtype=torch.bool), input_ids=x, is_prefill=prefill, ends_prefill=last
        )
        logits = model(
            input_ids=x, position_ids=step.positions, cache=cache, use_cache=True, logits_to_keep=1
        ).logits
        cache.end_step()
        return logits

    C = ids.shape[1]
    P = C if args.context_mode == "prompt" else min(args.prompt_tokens, C)
    chunk = args.prefill_chunk or C
    for s in range(0, P, chunk):
        logits = feed(ids[:, s : min(P, s + chunk)], prefill=True, last=min(P, s + chunk) == P)
    for s in range(P, C, chunk):  # the rest of the context arrives as generated text would, chunk by chunk
        logits = feed(ids[:, s : s + chunk], prefill=False)
    cache.pop_select_seconds()
    tok, times, select = logits[:, -1:].argmax(-1), [], 0.0
    for _ in range(args.decode_steps):
        sync()
        t0 = time.perf_counter()
        logits = feed(tok, prefill=False)
        sync()
        times.append(time.perf_counter() - t0)
        tok = logits[:, -1:].argmax(-1)
    select = cache.pop_select_seconds()
    held = cache.resident_bytes()
    seq = cache.sequence_kv_bytes()
    return {
        "step_s": statistics.median(times),
        "select_share": select / sum(times),
        "rows": float(cache.resident_rows().float().mean()),
        "bytes": held["device"] + held["host"],
        "device_bytes": held["device"],
        "host_bytes": held["host"],
        "kv_bytes": int(sum(int(v.sum()) for v in seq.values())),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    spec = model_spec(args.model)
    model, _ = load_model_and_tokenizer(spec, args.cache_dir, device=args.device, attn_implementation="zoomr")
    device = next(model.parameters()).device
    results: list[dict[str, Any]] = []
    for ctx in args.contexts:
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, min(4000, model.config.vocab_size), (1, ctx), generator=gen).to(device)
        measure(
            model,
            method_config("full", args.budget),
            ids,
            argparse.Namespace(**{**vars(args), "decode_steps": 4}),
        )
        best: dict[str, dict[str, Any]] = {}
        for _ in range(
            args.repeats
        ):  # interleaved repeats; the fastest median counts (the machine is shared)
            for name in args.policies:
                r = measure(model, method_config(name, args.budget), ids, args)
                if name not in best or r["step_s"] < best[name]["step_s"]:
                    best[name] = r
        ref = best["full"]
        for name, r in best.items():
            print(
                f"  ctx {ctx:>6} {name:<16} {r['step_s'] * 1e3:8.2f} ms/step  rows {r['rows']:.0f}",
                flush=True,
            )
            results.append({
                "context": ctx, "policy": name, **r,
                "time_ratio": r["step_s"] / ref["step_s"],
                "rows_ratio": r["rows"] / ref["rows"],
                "bytes_ratio": r["bytes"] / ref["bytes"],
            })  # fmt: skip
        if args.hf_reference:
            t = min(
                hf_dynamic(model, ids, args.decode_steps, args.prefill_chunk or ctx)
                for _ in range(args.repeats)
            )
            results.append(
                {"context": ctx, "policy": "hf_dynamic", "step_s": t, "time_ratio": t / ref["step_s"]}
            )
    return {
        "model": args.model, "device": str(device), "threads": torch.get_num_threads(), "budget_rows": args.budget,
        "decode_steps": args.decode_steps, "prefill_chunk": args.prefill_chunk, "context_mode": args.context_mode,
        "prompt_tokens": args.prompt_tokens, "repeats": args.repeats, "results": results,
    }  # fmt: skip


def table(report: dict[str, Any]) -> str:
    head = (
        f"model {report['model']} on {report['device']}, {report['threads']} thread(s), budget "
        f"{report['budget_rows']} rows, context as {report['context_mode']} ({report['prompt_tokens']}-token "
        f"prompt), {report['decode_steps']} timed decode steps, best of {report['repeats']}; ratios vs full KV"
    )
    lines = [head, "", "| context | policy | ms/step | time ÷ full | rows | rows ÷ full | bytes (MiB) | bytes ÷ full | select % |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in report["results"]:
        if r["policy"] == "hf_dynamic":
            lines.append(f"| {r['context']} | hf_dynamic (DynamicCache+SDPA) | {r['step_s'] * 1e3:.2f} | "
                         f"{r['time_ratio']:.2f} | | | | | |")  # fmt: skip
            continue
        lines.append(
            f"| {r['context']} | {r['policy']} | {r['step_s'] * 1e3:.2f} | {r['time_ratio']:.2f} | {r['rows']:.0f} | "
            f"{r['rows_ratio']:.3f} | {r['bytes'] / 2**20:.2f} | {r['bytes_ratio']:.3f} | {100 * r['select_share']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny-qwen2", help="a conf/model/<name>.yaml")
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 8192])
    p.add_argument("--decode-steps", type=int, default=32)
    p.add_argument("--budget", type=int, default=512, help="budget_rows of every budgeted policy")
    p.add_argument("--policies", nargs="+", default=POLICIES, help="conf/method/<name>.yaml names")
    p.add_argument("--prefill-chunk", type=int, default=512)
    p.add_argument(
        "--context-mode",
        choices=["generated", "prompt"],
        default="generated",
        help="generated: a short prompt, the rest fed as generation-phase chunks; prompt: all prefill",
    )
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--no-hf-reference", dest="hf_reference", action="store_false")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if "full" not in args.policies:
        args.policies = ["full", *args.policies]
    report = run(args)
    text = table(report)
    print("\n" + text)
    out = Path(
        args.out
        or REPO_ROOT / "runs" / "bench_decode" / f"bench-{args.model}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"\nwrote {out}")
    return report


if __name__ == "__main__":
    main()
