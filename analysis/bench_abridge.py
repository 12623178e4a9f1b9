"""AbridgeKV measurements, printed as a table and written as JSON (``--out``).

``step``: train step time (forward + backward) of the block-masked stream against plain causal
attention on the SAME interleaved tokens, in the same process: the mask's cost. Three arms: the
AbridgeKV per-layer masks (dense boolean + SDPA on CPU, FlexAttention BlockMask on CUDA), a dense
causal mask (same kernel path as the dense block mask), and SDPA ``is_causal`` (no mask at all).

    OMP_NUM_THREADS=1 python -m analysis.bench_abridge step --out runs/bench/abridge_step.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from zoomr.abridge.data import batch_meta, build_streams, collate
from zoomr.abridge.forward import abridge_attention, token_ce
from zoomr.abridge.layout import AbridgeLayout
from zoomr.abridge.mask import layer_masks
from zoomr.models import ModelSpec, load_model, load_tokenizer

TINY = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def _timed(fn, repeats: int, warmup: int = 2) -> list[float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times


def bench_step(args) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    spec = ModelSpec(name="tiny-qwen2", arch="qwen2", tiny=TINY)
    model, tok = load_model(spec, device=device).train(), load_tokenizer(spec)
    layout = AbridgeLayout(args.block_size, args.num_pause)
    from data_prep.traces import load_trace_rows

    rows, _ = load_trace_rows(path="data_prep/data/traces/sky-t1-math-correct-5k-32b-ckpt140_aime24.jsonl")
    examples = [{"messages": r.messages()} for r in rows[: args.batch]]
    streams = build_streams(examples, tok, layout, 512, args.response_tokens).streams
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

    arms = {}
    with abridge_attention(model):
        arms["abridge block mask"] = _timed(
            lambda: step(layer_masks(batch_meta(batch), quotas, args.backend))(), args.repeats
        )
        arms["dense causal mask"] = _timed(step([causal] * len(quotas)), args.repeats)
        arms["sdpa is_causal"] = _timed(step(None), args.repeats)
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
        "batch": len(streams),
        "stream_tokens": length,
        "layout": f"C={layout.block_size} K={layout.num_pause} q={args.quota}",
        "mask_backend": args.backend,
        "repeats": args.repeats,
    }
    print(f"train step, {info}")
    print(f"{'arm':<22} {'median s':>9} {'min s':>8} {'÷ is_causal':>12}")
    for name, r in rows_out.items():
        print(f"{name:<22} {r['median_s']:>9.3f} {r['min_s']:>8.3f} {r['ratio_vs_is_causal']:>12.3f}")
    ratio = rows_out["abridge block mask"]["median_s"] / rows_out["dense causal mask"]["median_s"]
    print(f"block mask ÷ dense causal mask (same kernel): {ratio:.3f}")
    return {"part": "step", **info, "arms": rows_out, "block_mask_over_dense_causal": ratio}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("part", choices=["step"])
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--num-pause", type=int, default=16)
    ap.add_argument("--quota", type=int, default=8)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--response-tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    result = bench_step(args)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
