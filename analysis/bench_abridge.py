"""AbridgeKV measurements, printed as a table and written as JSON (``--out``).

``step``: train step time (forward + backward) of the block-masked stream against plain causal
attention on the SAME interleaved tokens, in the same process: the mask's cost. Arms: the AbridgeKV
per-layer masks under each back end (``--backends``; default dense boolean + SDPA and chunked SDPA on
CPU, FlexAttention BlockMask and chunked on CUDA), a dense causal mask (same kernel path as the dense
block mask), and SDPA ``is_causal`` (no mask at all).

    OMP_NUM_THREADS=1 python -m analysis.bench_abridge step --out runs/bench/abridge_step.json
    OMP_NUM_THREADS=2 python -m analysis.bench_abridge step --data testbed --quota 16 --response-tokens 1024

``kv``: resident KV bytes of whole generations (every sequence runs to ``--new-tokens``), full KV ÷
AbridgeKV, from the engine's per-step page accounting, against the analytic ceiling C / q̄ (reached only
when the prompt and the open block are negligible) and the analytic value for these prompt lengths.

    OMP_NUM_THREADS=1 python -m analysis.bench_abridge kv --out runs/bench/abridge_kv.json

``parity``: trainer forward vs incremental generator on a trained checkpoint (see zoomr.abridge.parity).

    OMP_NUM_THREADS=1 python -m analysis.bench_abridge parity --checkpoint runs/train/abridge-tiny-qwen2-traces/final
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from analysis.cli import require_at_least, require_checkpoint
from zoomr.abridge.data import batch_meta, build_streams, collate
from zoomr.abridge.forward import abridge_attention, token_ce
from zoomr.abridge.layout import AbridgeLayout
from zoomr.abridge.mask import layer_masks
from zoomr.models import ModelSpec, load_model, load_tokenizer
from zoomr.paths import output_file

TINY = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def _timed_lockstep(fns: dict, repeats: int, warmup: int = 1) -> dict[str, list[float]]:
    """Time every arm once per round, round after round, so machine noise hits all arms alike."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t0)
    return times


TESTBED_MODEL = "analysis/results/miniature/base_model"  # the shipped recall-testbed model (tiny-testbed)


def _step_streams(args, layout: AbridgeLayout, device: torch.device):
    """(model, tokenizer, streams) of the step bench: ``--data traces`` (the random tiny qwen2 on real traces,
    loss on every response token) or ``testbed`` (the shipped testbed model on testbed traces, loss on what
    the model writes: attention is most of its step)."""
    if args.data == "testbed":
        from dataclasses import asdict

        from zoomr.abridge.trainer import load_streams
        from zoomr.paths import resolve_repo_path
        from zoomr.schemas.testbed import TestbedData

        spec = ModelSpec(name="tiny-testbed", arch="llama", hf_id=str(resolve_repo_path(TESTBED_MODEL)))
        model, tok = load_model(spec, device=device), load_tokenizer(spec)
        data = asdict(TestbedData(trace_tokens=args.response_tokens)) | {"loader": "zoomr.testbed.task"}
        made = load_streams(data, tok, layout, 512, args.response_tokens + 16, heldout=0).streams
        return model, tok, [made[i] for i in range(args.batch)]
    from data_prep.traces import load_trace_rows

    spec = ModelSpec(name="tiny-qwen2", arch="qwen2", tiny=TINY)
    model, tok = load_model(spec, device=device), load_tokenizer(spec)
    rows, _ = load_trace_rows(path="data_prep/data/traces/sky-t1-math-correct-5k-32b-ckpt140_aime24.jsonl")
    examples = [{"messages": r.messages()} for r in rows[: args.batch]]
    return model, tok, build_streams(examples, tok, layout, 512, args.response_tokens).streams


def bench_step(args) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    layout = AbridgeLayout(args.block_size, args.num_pause)
    model, tok, streams = _step_streams(args, layout, device)
    model.train()
    batch = {k: v.to(device) for k, v in collate(streams, tok.pad_token_id).items()}
    quotas = [args.quota] * model.config.num_hidden_layers
    length = batch["input_ids"].shape[1]
    causal = (
        torch.ones(length, length, dtype=torch.bool, device=device)
        .tril()[None, None]
        .expand(len(streams), 1, -1, -1)
    )

    def step(masks):
        def run():
            model.zero_grad(set_to_none=True)
            logits = model(
                input_ids=batch["input_ids"],
                position_ids=batch["position_ids"],
                abridge_masks=masks,
                use_cache=False,
            ).logits
            token_ce(logits, batch["labels"]).sum().backward()

        return run

    default = ["flex" if device.type == "cuda" else "dense", "chunked"]
    backends = args.backends.split(",") if args.backends else default

    def block_mask(backend: str):
        return lambda: step(layer_masks(batch_meta(batch), quotas, backend))()  # the mask is built inside the step

    with abridge_attention(model):
        arms = _timed_lockstep(
            {
                **{f"block mask ({b})": block_mask(b) for b in backends},
                "dense causal mask": step([causal] * len(quotas)),
                "sdpa is_causal": step(None),
            },
            args.repeats,
        )
    base = statistics.median(arms["sdpa is_causal"])
    rows_out = {
        name: {
            "median_s": statistics.median(t),
            "min_s": min(t),
            "ratio_vs_is_causal": statistics.median(t) / base,
        }
        for name, t in arms.items()
    }
    info = {
        "device": str(device),
        "threads": torch.get_num_threads(),
        "data": args.data,
        "batch": len(streams),
        "stream_tokens": length,
        "layout": f"C={layout.block_size} K={layout.num_pause} q={args.quota}",
        "mask_backends": backends,
        "repeats": args.repeats,
    }
    print(f"train step, {info}")
    print(f"{'arm':<24} {'median s':>9} {'min s':>8} {'÷ is_causal':>12}")
    for name, r in rows_out.items():
        print(f"{name:<24} {r['median_s']:>9.3f} {r['min_s']:>8.3f} {r['ratio_vs_is_causal']:>12.3f}")
    ratios = {
        b: rows_out[f"block mask ({b})"]["median_s"] / rows_out["dense causal mask"]["median_s"] for b in backends
    }
    for b, r in ratios.items():
        print(f"block mask ({b}) ÷ dense causal mask: {r:.3f}")
    return {"part": "step", **info, "arms": rows_out, "block_mask_over_dense_causal": ratios}


def _load(checkpoint: str | None):
    """The trained checkpoint when given (its layout), else the random tiny model with the default layout."""
    from zoomr.abridge.artifacts import load_abridge_config

    if checkpoint:
        layout, quotas, _ = load_abridge_config(checkpoint)
        spec = ModelSpec(name="abridge", arch="qwen2", hf_id=checkpoint)
    else:
        layout, quotas = AbridgeLayout(64, 16), [8] * TINY["num_hidden_layers"]
        spec = ModelSpec(name="tiny-qwen2", arch="qwen2", tiny=TINY)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return load_model(spec, device=device), load_tokenizer(spec), layout, quotas


def _prompts(tok, n: int) -> list[list[int]]:
    from data_prep.traces import load_trace_rows
    from zoomr.abridge.data import prompt_response_ids

    rows, _ = load_trace_rows(path="data_prep/data/traces/sky-t1-math-correct-5k-32b-ckpt140_aime24.jsonl")
    return [prompt_response_ids({"messages": r.messages()}, tok)[0] for r in rows[:n]]


def analytic_rows(prompt: int, new: int, c: int, q: float) -> tuple[float, float]:
    """Mean rows per (layer, head) over decode steps t = 1..new-1 (t tokens fed after the prompt)."""
    ts = range(1, new)
    full = statistics.mean(prompt + t for t in ts)
    abridge = statistics.mean(prompt + (t // c) * q + t % c for t in ts)
    return full, abridge


def bench_kv(args) -> dict:
    from zoomr.cache.abridge import AbridgeCache, AbridgeMethod
    from zoomr.engine import DecodeSettings, generate

    model, tok, layout, quotas = _load(args.checkpoint)
    L = model.config.num_hidden_layers
    prompts = _prompts(tok, args.batch)
    settings = DecodeSettings(max_new_tokens=args.new_tokens, stop_token_ids=[], progress=True)
    up, down = 2 * quotas[0], quotas[0] // 2
    per_layer = [down, down, up] + [quotas[0]] * (L - 3) if L >= 3 else quotas
    arms = {"full": None, f"abridge q={quotas[0]}": quotas, f"abridge per-layer {per_layer}": per_layer}
    if 2 * quotas[0] <= layout.num_pause:
        arms[f"abridge q={2 * quotas[0]}"] = [2 * quotas[0]] * L
    results = {}
    for name, qs in arms.items():
        cache = (
            {"policy": "full"}
            if qs is None
            else AbridgeCache(AbridgeMethod(), model.config, tok, layout=layout, quotas=qs)
        )
        t0 = time.perf_counter()
        outs = generate(model, tok, prompts, cache, settings)
        dt = time.perf_counter() - t0
        kv = [float(o.stats.kv_bytes[1:].mean()) for o in outs]
        rows = [float(o.stats.rows[1:].mean()) for o in outs]
        results[name] = {
            "mean_kv_bytes": statistics.mean(kv),
            "peak_kv_bytes": statistics.mean(float(o.stats.kv_bytes.max()) for o in outs),
            "mean_rows": statistics.mean(rows),
            "tokens_per_s": sum(o.n_tokens for o in outs) / dt,
            "quotas": qs,
        }
    full = results["full"]
    p_mean = statistics.mean(len(p) for p in prompts)
    print(
        f"resident KV over whole generations: {len(prompts)} prompts (mean {p_mean:.0f} tokens) x {args.new_tokens} new tokens, C={layout.block_size} K={layout.num_pause}"
    )
    print(
        f"{'arm':<34} {'mean KV MiB':>11} {'full ÷ arm':>10} {'rows ratio':>10} {'analytic':>9} {'ceiling C/q':>11} {'tok/s':>7}"
    )
    for name, r in results.items():
        r["full_over_arm_bytes"] = full["mean_kv_bytes"] / r["mean_kv_bytes"]
        r["full_over_arm_rows"] = full["mean_rows"] / r["mean_rows"]
        if r["quotas"]:
            q = statistics.mean(r["quotas"])
            a_full, a_ab = analytic_rows(round(p_mean), args.new_tokens, layout.block_size, q)
            r["analytic_ratio"], r["ceiling"] = a_full / a_ab, layout.block_size / q
        else:
            r["analytic_ratio"] = r["ceiling"] = 1.0
        print(
            f"{name:<34} {r['mean_kv_bytes'] / 2**20:>11.3f} {r['full_over_arm_bytes']:>10.2f} "
            f"{r['full_over_arm_rows']:>10.2f} {r['analytic_ratio']:>9.2f} {r['ceiling']:>11.2f} {r['tokens_per_s']:>7.0f}"
        )
    return {
        "part": "kv",
        "prompts": len(prompts),
        "mean_prompt_tokens": p_mean,
        "new_tokens": args.new_tokens,
        "layout": f"C={layout.block_size} K={layout.num_pause} {layout.code_positions}",
        "checkpoint": args.checkpoint,
        "threads": torch.get_num_threads(),
        "arms": results,
    }


PARITY_TOL = 4.5e-4  # nats: the paper's parity bar (appendix E, Table 10)
WRONG_OVER_PARITY = 100  # a wrong schedule must differ at least this many times more


def parity_verdict(reports: list[dict]) -> tuple[bool, str]:
    """PASS when every prompt's served CE matches the trainer's within the paper's bar, a wrong schedule differs
    >= 100x more, and the served model follows the compressed history wherever that differs from full KV."""
    worst = max(r["max_abs_ce_diff"] for r in reports)
    ratio = min(r["wrong_over_parity"] for r in reports)
    follows = all(r["served_follows_compressing"] == r["disagreeing_tokens"] for r in reports)
    ok = worst < PARITY_TOL and ratio >= WRONG_OVER_PARITY and follows
    return ok, (
        f"{'PASS' if ok else 'FAIL'}: max |ΔCE| {worst:.3g} nats (bar {PARITY_TOL:g}), wrong schedule "
        f"{ratio:.3g}x larger (need >= {WRONG_OVER_PARITY}), served follows the compressed history on "
        f"{'every' if follows else 'NOT every'} disagreeing token"
    )


def bench_parity(args) -> dict:
    from zoomr.abridge.parity import parity_report

    model, tok, layout, quotas = _load(args.checkpoint)
    if args.float64:  # separates the method's error from fp32 rounding (incremental vs one forward)
        model = model.double()
    wrong = list(quotas)
    wrong[0] = quotas[0] + 1 if quotas[0] < layout.num_pause else quotas[0] - 1
    reports = [
        parity_report(model, tok, p, layout, quotas, wrong, args.new_tokens)
        for p in _prompts(tok, args.batch)
    ]
    keys = [
        "tokens",
        "max_abs_ce_diff",
        "mean_abs_ce_diff",
        "wrong_schedule_max_abs_ce_diff",
        "wrong_over_parity",
        "full_history_max_abs_ce_diff",
        "disagreeing_tokens",
        "served_follows_compressing",
    ]
    print(
        f"parity (model {next(model.parameters()).dtype}, CE in float64), {args.checkpoint or 'random tiny model'}: "
        f"layout {layout}, quotas {quotas}, wrong {wrong}"
    )
    print(" ".join(f"{k:>14.14}" for k in keys))
    for r in reports:
        print(" ".join(f"{r[k]:>14.3g}" if isinstance(r[k], float) else f"{r[k]:>14}" for k in keys))
    passed, verdict = parity_verdict(reports)
    print(verdict)
    return {
        "part": "parity",
        "passed": passed,
        "verdict": verdict,
        "model_dtype": str(next(model.parameters()).dtype),
        "checkpoint": args.checkpoint,
        "quotas": quotas,
        "wrong": wrong,
        "reports": reports,
    }


PART_OPTIONS = {  # the options each part reads
    "step": {"block_size", "num_pause", "quota", "batch", "response_tokens", "repeats", "data", "backends"},
    "kv": {"checkpoint", "new_tokens", "batch"},
    "parity": {"checkpoint", "new_tokens", "float64", "batch"},
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=["step", "kv", "parity"])
    ap.add_argument("--checkpoint", default=None, help="a +method=abridge final/ directory (kv, parity)")
    ap.add_argument("--new-tokens", type=int, default=2048)
    ap.add_argument("--float64", action="store_true", help="parity in float64")
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--num-pause", type=int, default=16)
    ap.add_argument("--quota", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--response-tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--data", choices=["traces", "testbed"], default="traces", help="step: model and streams")
    ap.add_argument("--backends", default=None, help="comma list of mask back ends (step; default: see above)")
    ap.add_argument("--out", type=lambda v: Path(output_file(v)), default=None, help="JSON file (default runs/bench/abridge_<part>.json)")
    args = ap.parse_args(argv)
    require_at_least(ap, args, 1, "new_tokens", "block_size", "num_pause", "batch", "response_tokens", "repeats")
    require_at_least(ap, args, 0, "quota")
    if args.part == "step" and args.quota > args.num_pause:
        ap.error(f"--quota {args.quota} > --num-pause {args.num_pause}: a layer keeps at most its K code rows")
    if args.checkpoint and args.part == "step":
        ap.error("--checkpoint applies to kv and parity (step times the block mask on the random tiny model)")
    ignored = [  # a size the part never reads, e.g. kv --block-size 16, ran at C=64 without a word
        f"--{k.replace('_', '-')} ({'/'.join(p for p, keys in PART_OPTIONS.items() if k in keys)} only)"
        for k in sorted(set().union(*PART_OPTIONS.values()) - PART_OPTIONS[args.part])
        if getattr(args, k) != ap.get_default(k)
    ]
    if ignored:
        ap.error(f"{', '.join(ignored)}: not read by {args.part} (kv and parity take the layout of --checkpoint, or "
                 "C=64 K=16 q=8 on the random tiny model)")  # fmt: skip
    if args.checkpoint:
        require_checkpoint(ap, args.checkpoint, "--checkpoint")
    result = {"step": bench_step, "kv": bench_kv, "parity": bench_parity}[args.part](args)
    out = args.out or Path("runs/bench") / f"abridge_{args.part}.json"  # like the other benches: runs/bench/
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    from zoomr.script import run_script

    run_script(main)
