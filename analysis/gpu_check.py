"""A prepared GPU check (sized for ≤ 8 minutes on one H100/H200, not yet run on one): random-init weights of the R1-Distill-Qwen-7B
architecture, no hub. Writes ``DIR/gpu_check.json`` + ``DIR/gpu_check.md`` (default ``analysis/results/gpu/``; with
``--dry-run`` ``runs/gpu_check/dry_run/`` under the working directory).

    python -m analysis.gpu_check                       # on a GPU machine, every section
    python -m analysis.gpu_check --dry-run --out /tmp/g  # anywhere: tiny shapes, seconds (tests the code path)
    python -m analysis.gpu_check --only flex memory    # some sections

Sections (each one prints its table as it finishes and is written at once, so a crash loses nothing done):

- ``flex``: AbridgeKV train step (forward + backward) under its per-layer FlexAttention ``BlockMask``
  ÷ the same step with SDPA ``is_causal`` and ÷ a FlexAttention causal ``BlockMask`` (same kernel), at block
  size C = 512 and 1024 (K = C/2 pause tokens, quota C/4: 4:1), on ``--flex-layers`` layers of the 7B shape;
- ``zoomr_offload``: ZoomR with its full KV on host — device bytes, host bytes, decode-step time with and
  without prefetch overlap, and full KV on the device — teacher-forced on a summary-structured stream;
- ``memory``: resident KV bytes after ``--gen-tokens`` (16K) generated tokens × batch ``--mem-batch`` (16) for
  full KV, ZoomR and AbridgeKV 4:1 (C = 512, q = 128), measured by the engine on ``--mem-layers`` layers of
  the 7B shape (every layer holds the same rows under these arms) and scaled to its 28 layers;
- ``throughput``: ``zoomr.engine.generate(full)`` vs ``model.generate(DynamicCache)`` tokens/s at batch
  1 / 8 / 32 on the full-depth 7B architecture (bf16).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from analysis.cli import brief, require_at_least, require_device
from zoomr.paths import REPO_ROOT, output_dir, output_problem
from zoomr.rundir import write_text_atomic

R1_QWEN_7B = {  # deepseek-ai/DeepSeek-R1-Distill-Qwen-7B config.json (Qwen2ForCausalLM)
    "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
    "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 131072, "rope_theta": 10000.0,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
}  # fmt: skip
DRY = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
       "num_key_value_heads": 2, "max_position_embeddings": 32768}  # fmt: skip
SECTIONS = ("flex", "zoomr_offload", "memory", "throughput")
RESULTS_DIR = REPO_ROOT / "analysis" / "results" / "gpu"  # the GPU run's results, committed
DRY_RUN_OUT = "runs/gpu_check/dry_run"  # under the working directory, like the benches' runs/<bench>/


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def random_model(args: argparse.Namespace, layers: int | None, vocab: int, attn: str = "sdpa"):
    """A Qwen2 model of the 7B architecture (or the dry-run shape) with random weights, on the device."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = dict(DRY if args.dry_run else R1_QWEN_7B)
    shape["num_hidden_layers"] = layers or shape["num_hidden_layers"]
    shape["vocab_size"] = vocab
    cfg = Qwen2Config(**shape, attn_implementation=attn)
    torch.manual_seed(0)
    with torch.device(args.device):
        model = Qwen2ForCausalLM(cfg).to(args.dtype)
    return model.eval()


def tokenizer():
    """The project's local tokenizer (every special token the methods need; built offline)."""
    from zoomr.models import ModelSpec, load_tokenizer

    return load_tokenizer(ModelSpec(name="tiny-qwen2", arch="qwen2", tiny={"hidden_size": 64, "num_hidden_layers": 1,
                                                                          "num_attention_heads": 2, "num_key_value_heads": 1,
                                                                          "intermediate_size": 64}))  # fmt: skip


def lockstep(fns: dict[str, Any], repeats: int) -> dict[str, float]:
    """Median seconds of every arm, arms interleaved round by round (after one warm-up round)."""
    from analysis.bench_abridge import _timed_lockstep

    return {k: statistics.median(v) for k, v in _timed_lockstep(fns, repeats).items()}


# --------------------------------------------------------------------------------------------- sections


def section_flex(args, tok) -> dict[str, Any]:
    from torch.nn.attention.flex_attention import create_block_mask

    from data_prep.traces import load_trace_rows
    from zoomr.abridge.data import batch_meta, build_streams, collate
    from zoomr.abridge.forward import abridge_attention, token_ce
    from zoomr.abridge.layout import AbridgeLayout, add_pause_tokens
    from zoomr.abridge.mask import layer_masks

    rows, _ = load_trace_rows(
        path=str(REPO_ROOT / "data_prep/data/traces/sky-t1-math-correct-5k-32b-ckpt140_aime24.jsonl")
    )
    model = random_model(args, args.flex_layers, len(tok))
    model.train()
    backend = "flex" if torch.cuda.is_available() else "dense"
    out = []
    for C in args.flex_blocks:
        layout = AbridgeLayout(C, C // 2)
        add_pause_tokens(model, tok, layout.num_pause)
        examples = [{"messages": r.messages()} for r in rows[: args.flex_batch]]
        streams = build_streams(examples, tok, layout, 512, args.flex_response).streams
        batch = {k: v.to(args.device) for k, v in collate(streams, tok.pad_token_id).items()}
        L = batch["input_ids"].shape[1]
        quotas = [C // 4] * model.config.num_hidden_layers

        def causal(b, h, q, kv):
            return kv <= q

        if backend == "flex":
            flex_causal = create_block_mask(
                causal, len(streams), None, L, L, device=args.device, _compile=True
            )
            causal_arm = [flex_causal] * len(quotas)
        else:
            causal_arm = [torch.ones(L, L, dtype=torch.bool, device=args.device).tril()[None, None]] * len(
                quotas
            )

        def step(masks_fn, batch=batch):
            def run():
                model.zero_grad(set_to_none=True)
                logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                               abridge_masks=masks_fn(), use_cache=False).logits  # fmt: skip
                token_ce(logits, batch["labels"]).sum().backward()

            return run

        with abridge_attention(model):
            t = lockstep({
                "abridge_block_mask": step(lambda b=batch, q=quotas: layer_masks(batch_meta(b), q, backend)),
                "causal_block_mask": step(lambda c=causal_arm: c),
                "sdpa_is_causal": step(lambda: None),
            }, args.repeats)  # fmt: skip
        out.append({"block_size": C, "num_pause": C // 2, "quota": C // 4, "stream_tokens": L, "batch": len(streams),
                    "mask_backend": backend, **{f"{k}_s": v for k, v in t.items()},
                    "ratio_vs_is_causal": t["abridge_block_mask"] / t["sdpa_is_causal"],
                    "ratio_vs_causal_block_mask": t["abridge_block_mask"] / t["causal_block_mask"]})  # fmt: skip
    model.zero_grad(set_to_none=True)
    return {"layers": args.flex_layers or "all", "rows": out}


def section_zoomr_offload(args, tok) -> dict[str, Any]:
    from analysis.bench_zoomr import structured_stream
    from zoomr.attention import use_policy_attention
    from zoomr.cache import build_policy

    model = use_policy_attention(random_model(args, args.zoomr_layers, len(tok)))
    ids = structured_stream(tok, args.zoomr_prompt, args.zoomr_gen, 250, 20)
    zcfg = {"policy": "zoomr", "top_k": 2, "consensus": 2, "window": 512}
    arms = {"full": {"policy": "full"}, "zoomr_offload_prefetch": {**zcfg, "offload": True, "prefetch": True},
            "zoomr_offload_no_prefetch": {**zcfg, "offload": True, "prefetch": False},
            "zoomr_device": {**zcfg, "offload": False}}  # fmt: skip
    caches = {k: build_policy(v, model.config, tok) for k, v in arms.items()}
    x = torch.tensor([ids], device=args.device)
    P = args.zoomr_prompt
    times: dict[str, list[float]] = {k: [] for k in caches}
    with torch.no_grad():
        for c in caches.values():
            st = c.begin_step(torch.ones(1, P, dtype=torch.bool, device=args.device), input_ids=x[:, :P])
            model(x[:, :P], cache=c, use_cache=True, position_ids=st.positions, logits_to_keep=1)
            c.end_step()
        for t in range(P, len(ids) - 1):
            for k, c in caches.items():
                st = c.begin_step(
                    torch.ones(1, 1, dtype=torch.bool, device=args.device), input_ids=x[:, t : t + 1]
                )
                sync()
                t0 = time.perf_counter()
                model(x[:, t : t + 1], cache=c, use_cache=True, position_ids=st.positions)
                c.end_step()
                sync()
                times[k].append(time.perf_counter() - t0)
    rows = []
    for k, c in caches.items():
        held = c.resident_bytes()
        ts = times[k][len(times[k]) // 10 :]
        rows.append({"arm": k, "step_ms": 1e3 * statistics.median(ts), "device_bytes": held["device"],
                     "host_bytes": held["host"], "rows": float(c.resident_rows().float().mean())})  # fmt: skip
    full = rows[0]
    for r in rows:
        r["step_ratio_vs_full"] = r["step_ms"] / full["step_ms"]
        r["device_bytes_over_full"] = r["device_bytes"] / full["device_bytes"]
    return {"layers": args.zoomr_layers, "prompt": P, "generated": args.zoomr_gen, "rows": rows}


def section_memory(args, tok) -> dict[str, Any]:
    from analysis.bench_zoomr import structured_stream
    from zoomr.abridge.layout import AbridgeLayout, add_pause_tokens
    from zoomr.cache import build_policy
    from zoomr.cache.abridge import AbridgeCache, AbridgeMethod
    from zoomr.engine import DecodeSettings, generate

    model = random_model(args, args.mem_layers, len(tok))
    layout = AbridgeLayout(512 if not args.dry_run else 32, 256 if not args.dry_run else 16)
    quota = layout.num_pause // 2  # C / 4: 4:1
    add_pause_tokens(model, tok, layout.num_pause)
    L, B, G, P = model.config.num_hidden_layers, args.mem_batch, args.gen_tokens, args.mem_prompt
    stream = structured_stream(tok, P, G, 250 if not args.dry_run else 40, 20 if not args.dry_run else 6)
    prompts, script = [stream[:P]] * B, [stream[P : P + G]] * B  # the environment writes the structured trace
    arms = {
        "full": lambda: build_policy({"policy": "full"}, model.config, tok),
        "zoomr": lambda: build_policy(
            {"policy": "zoomr", "top_k": 2, "consensus": 2, "window": 512, "offload": True}, model.config, tok
        ),  # fmt: skip
        "abridge_4to1": lambda: AbridgeCache(
            AbridgeMethod(layout_from_checkpoint=False), model.config, tok, layout=layout, quotas=[quota] * L
        ),  # fmt: skip
    }
    settings = DecodeSettings(max_new_tokens=G, stop_token_ids=[], progress=True, stats_every=max(1, G // 64))
    scale = R1_QWEN_7B["num_hidden_layers"] / L
    rows = []
    for name, make in arms.items():
        t0 = time.perf_counter()
        outs = generate(model, tok, prompts, make(), settings, script=script)
        s = outs[0].stats
        rows.append({
            "arm": name, "seconds": time.perf_counter() - t0, "generated": outs[0].n_tokens,
            "kv_bytes_per_seq_device": int(s.kv_bytes[-1]), "kv_bytes_per_seq_host": int(s.kv_bytes_host[-1]),
            "device_bytes_held": int(s.device_bytes[-1]), "host_bytes_held": int(s.host_bytes[-1]),
            "device_gib_batch_7b": float(s.device_bytes[-1]) * scale / 2**30,
            "kv_gib_batch_7b": float(s.kv_bytes[-1]) * B * scale / 2**30, "rows_mean": float(s.rows[-1].mean()),
        })  # fmt: skip
        print(f"  memory {name}: {brief(rows[-1])}", flush=True)
    full = rows[0]
    for r in rows:
        r["device_bytes_over_full"] = r["device_bytes_held"] / full["device_bytes_held"]
    return {"layers_measured": L, "scaled_to_layers": R1_QWEN_7B["num_hidden_layers"], "batch": B,
            "generated_tokens": G, "prompt_tokens": P, "rows": rows}  # fmt: skip


def section_throughput(args, tok) -> dict[str, Any]:
    from transformers import DynamicCache

    from zoomr.engine import DecodeSettings, generate

    model = random_model(args, None if not args.dry_run else 2, len(tok))
    P, N = args.tp_prompt, args.tp_new
    rows = []
    for B in args.tp_batches:
        ids = torch.randint(200, 4000, (B, P), generator=torch.Generator().manual_seed(B)).to(args.device)
        settings = DecodeSettings(max_new_tokens=N, stop_token_ids=[], progress=False)

        def ours(ids=ids, settings=settings):
            generate(model, tok, ids.tolist(), {"policy": "full"}, settings)

        def theirs(ids=ids):
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), cache=DynamicCache(config=model.config),
                           max_new_tokens=N, min_new_tokens=N, do_sample=False, pad_token_id=0)  # fmt: skip

        t = lockstep({"engine_full": ours, "hf_generate_dynamic": theirs}, max(1, args.repeats // 2))
        rows.append({"batch": B, "prompt": P, "new_tokens": N, **{f"{k}_s": v for k, v in t.items()},
                     "engine_tokens_per_s": B * N / t["engine_full"],
                     "hf_tokens_per_s": B * N / t["hf_generate_dynamic"],
                     "engine_over_hf_time": t["engine_full"] / t["hf_generate_dynamic"]})  # fmt: skip
        print(f"  throughput B{B}: {brief(rows[-1])}", flush=True)
    return {"layers": model_layers(args), "rows": rows}


def model_layers(args) -> int:
    return DRY["num_hidden_layers"] if args.dry_run else R1_QWEN_7B["num_hidden_layers"]


# --------------------------------------------------------------------------------------------- driver


FULL_SIZES: dict[str, Any] = {
    "repeats": 5, "flex_blocks": [512, 1024], "flex_layers": 4, "flex_batch": 2, "flex_response": 8192,
    "zoomr_layers": 4, "zoomr_prompt": 512, "zoomr_gen": 1024, "mem_layers": 2, "mem_batch": 16, "mem_prompt": 256,
    "gen_tokens": 16384, "tp_batches": [1, 8, 32], "tp_prompt": 512, "tp_new": 128,
}  # fmt: skip
DRY_SIZES: dict[str, Any] = {
    **FULL_SIZES, "repeats": 2, "flex_blocks": [32, 64], "flex_layers": 2, "flex_response": 256, "zoomr_layers": 2,
    "zoomr_prompt": 64, "zoomr_gen": 96, "mem_layers": 2, "mem_batch": 2, "mem_prompt": 32, "gen_tokens": 96,
    "tp_batches": [1, 2], "tp_prompt": 16, "tp_new": 8,
}  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--dry-run", action="store_true", help="tiny shapes and lengths (any device): checks the code"
    )
    p.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    p.add_argument(
        "--out", type=output_dir, help=f"default {RESULTS_DIR.relative_to(REPO_ROOT)}/, with --dry-run {DRY_RUN_OUT}/"
    )
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    # sizes default to FULL_SIZES, or DRY_SIZES with --dry-run; a size given on the command line is kept either way
    p.add_argument("--repeats", type=int)
    p.add_argument("--flex-blocks", type=int, nargs="+")
    p.add_argument("--flex-layers", type=int)
    p.add_argument("--flex-batch", type=int)
    p.add_argument("--flex-response", type=int, help="response tokens per training stream")
    p.add_argument("--zoomr-layers", type=int)
    p.add_argument("--zoomr-prompt", type=int)
    p.add_argument("--zoomr-gen", type=int)
    p.add_argument("--mem-layers", type=int)
    p.add_argument("--mem-batch", type=int)
    p.add_argument("--mem-prompt", type=int)
    p.add_argument("--gen-tokens", type=int)
    p.add_argument("--tp-batches", type=int, nargs="+")
    p.add_argument("--tp-prompt", type=int)
    p.add_argument("--tp-new", type=int)
    args = p.parse_args(argv)
    for name, value in (DRY_SIZES if args.dry_run else FULL_SIZES).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    require_at_least(p, args, 1, *FULL_SIZES)
    if args.out is None:  # a dry run's tiny-shape numbers never land where the GPU results are kept
        args.out = DRY_RUN_OUT if args.dry_run else str(RESULTS_DIR)
        if problem := output_problem(args.out, directory=True):
            p.error(f"--out {problem}")
    require_device(p, args.device)  # cpu, or a cuda:N this machine has
    if not args.dry_run and not args.device.startswith("cuda"):
        p.error("the full check needs a GPU (7B-architecture shapes); use --dry-run on CPU")
    args.dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    return args


def table(report: dict[str, Any]) -> str:
    lines = [
        f"GPU check on {report['device']} ({report['gpu']}), torch {report['torch']}, dry run: {report['dry_run']}"
    ]
    for name, sec in report["sections"].items():
        lines += ["", f"## {name}" + (f" ({sec['error']})" if "error" in sec else "")]
        rows = sec.get("rows", [])
        if rows:
            keys = [k for k in rows[0] if not isinstance(rows[0][k], (dict, list))]
            lines += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
            for r in rows:
                lines.append(
                    "| "
                    + " | ".join(f"{r[k]:.4g}" if isinstance(r[k], float) else str(r[k]) for k in keys)
                    + " |"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "device": args.device, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__, "dry_run": args.dry_run, "architecture": R1_QWEN_7B if not args.dry_run else DRY,
        "args": {k: v for k, v in vars(args).items() if k != "dtype"}, "sections": {},
    }  # fmt: skip
    tok = tokenizer()
    t_all = time.perf_counter()
    for name in args.only:
        t0 = time.perf_counter()
        print(f"[gpu_check] {name} ...", flush=True)
        try:
            sec = globals()[f"section_{name}"](args, tok)
        except Exception as e:  # a failed section is reported, the others still run
            sec = {"error": f"{type(e).__name__}: {e}"}
        sec["seconds"] = time.perf_counter() - t0
        if torch.cuda.is_available():
            sec["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        report["sections"][name] = sec
        report["seconds"] = time.perf_counter() - t_all
        write_text_atomic(out / "gpu_check.json", json.dumps(report, indent=2, default=str))  # after every section
        write_text_atomic(out / "gpu_check.md", table(report) + "\n")
        print(table({**report, "sections": {name: sec}}), flush=True)
    print(f"\nwrote {out / 'gpu_check.json'} ({report['seconds']:.0f} s)")
    return report


def cli(argv: list[str] | None = None) -> int:
    """``python -m analysis.gpu_check``: exit status 1 when a section failed (its error is in the report, the other
    sections still ran), so a batch job or a script notices; 0 otherwise."""
    report = main(argv)
    failed = [name for name, sec in report["sections"].items() if "error" in sec]
    if failed:
        print(f"[gpu_check] failed: {', '.join(failed)} (the errors are in gpu_check.json)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    from zoomr.script import run_script

    run_script(cli)
