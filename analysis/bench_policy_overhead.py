"""Policy bookkeeping at paper scale, by simulation: µs per layer per decode step, no model.

    python -m analysis.bench_policy_overhead [--batch 16] [--context 16384] [--kv-heads 8] [--q-heads 32]
                                             [--head-dim 128] [--layers 1] [--steps 256] [--dtype float32]
                                             [--budget 1024] [--policies full streaming h2o ...] [--out DIR]

What a policy costs on top of attention itself, at the scale of the papers (32 layers, 8 KV heads, 16K
context, batch 16) — which the tiny model cannot show. Each policy's cache is built for a model config of
``--layers`` simulated layers (each layer's bookkeeping is independent of the others; rkv_serving sums scores
over them) and its stores are filled directly with the rows it holds in steady state after ``--context``
fed tokens (full / snapkv: all of them; budgeted policies: ``--budget``; the block-eviction ablation:
the prompt, ``keep`` rows per completed block and the open block; KVzap: a share of the older rows drawn per
(b, h) from ``KVZAP_KEPT`` and the whole window, ragged, so paged). Then ``--steps`` decode steps run the
real policy protocol — ``begin_step``, per layer ``update`` (append + hooks + the rows handed to attention),
``on_queries`` with random post-RoPE queries, ``on_attention`` with synthetic softmax weights for the
policies that ask for them (precomputed: producing them is attention's cost), ``after_attention``
(eviction), ``end_step`` — and are timed on one CPU thread. Reported per policy: mean (amortised over
compaction bursts) and median µs per layer per step, and the aten operators per layer per step (counted with
a dispatch mode in a separate pass; metadata-only views excluded: on a GPU each is a kernel launch) and the
host syncs among them (``.item()``/``int()``/``nonzero``: on a GPU each one stalls the launch queue).

Projection against an H100 decode step (the figure that matters is overhead ÷ step): a decode step of a
7B-class model is memory-bound, ``step ≈ (weight bytes + KV bytes read) / HBM bandwidth`` with 7.6 B
parameters in bf16 (15.2 GB; R1-Distill-Qwen-7B) and each policy's resident KV at the simulated shape,
at H100 SXM's 3.35 TB/s (an ideal-bandwidth *lower* bound on the step, so the ratios below are upper bounds).
GPU bookkeeping is estimated as ``ops × --launch-us`` (default 5 µs per eager op: dispatch + launch) plus the
bytes the kernels write, read and written once at HBM bandwidth (compaction traffic: H2O's tail slide is
O(rows) per step; an in-place scatter counts the elements it writes, not the whole buffer it returns), per layer
× 32 layers; the CPU-measured time × 32 is reported as a pessimistic bound (one CPU
thread moves memory far slower than HBM). Writes ``DIR/policy_overhead.json`` + ``.md``
(default ``runs/bench_policy_overhead/<time>/`` under the working directory).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import time
from collections import Counter
from types import SimpleNamespace
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from tqdm.auto import tqdm

from analysis.bench_decode import check_conf_names, method_config
from analysis.cli import bench_out_dir, require_at_least, write_bench_report
from zoomr.attention import _lookup
from zoomr.cache import build_policy
from zoomr.cache.kvzap import KVzapCache
from zoomr.kvzap.surrogate import KVzapConfig, KVzapModel
from zoomr.paths import output_dir

POLICIES = ["full", "streaming", "h2o", "snapkv", "rkv", "rkv_serving", "evict_recency", "evict_random",
            "evict_attention", "kvzap"]  # fmt: skip
KVZAP_KEPT = (0.3, 0.7)  # KVzap's steady state: each (b, h) holds a fraction of the context drawn from this range
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}
PAPER_LAYERS = 32
WEIGHT_BYTES_7B = 7.6e9 * 2  # R1-Distill-Qwen-7B parameters in bf16
H100_BANDWIDTH = 3.35e12  # B/s, H100 SXM5 HBM3 (spec sheet)


# metadata-only operators: no kernel on a GPU
VIEW_OPS = {"view", "_unsafe_view", "slice", "select", "expand", "as_strided", "unsqueeze", "squeeze", "alias",
            "t", "transpose", "permute", "detach", "lift_fresh", "reshape", "unbind", "split", "chunk"}  # fmt: skip
SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select"}  # results sized / read on the host: a GPU sync


SCATTER_OPS = {"index_put_", "index_add_", "index_copy_", "scatter_", "scatter_add_", "masked_fill_"}


def _scattered_bytes(name: str, args: tuple) -> int:
    """Bytes an in-place scatter into ``args[0]`` writes: the indexed elements, not the whole buffer it returns."""
    dest = args[0]
    if name == "index_put_":  # dest[indices] = values: indexed positions × the dims no index covers
        indices, covered, n = args[1], 0, 1
        shapes = []
        for i in indices:
            if i is None:  # a whole dimension
                n *= dest.shape[covered]
                covered += 1
            elif i.dtype == torch.bool:  # a mask over i.dim() dimensions
                shapes.append((int(i.sum()),))
                covered += i.dim()
            else:
                shapes.append(tuple(i.shape))
                covered += 1
        n *= math.prod(torch.broadcast_shapes(*shapes)) if shapes else 1
        n *= math.prod(dest.shape[covered:])
    elif name in ("index_add_", "index_copy_"):  # dest.index_add_(dim, index, source)
        n = args[3].numel()
    elif name == "masked_fill_":
        n = int(torch.broadcast_to(args[1], dest.shape).sum())
    else:  # scatter_ / scatter_add_ (dim, index, src): one element per index entry
        n = args[2].numel()
    return n * dest.element_size()


class _CountOps(TorchDispatchMode):
    """Counts the aten operators dispatched inside the context: kernels, views, host syncs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.bytes_written = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        out = func(*args, **(kwargs or {}))
        if name in SCATTER_OPS:  # in place into part of a buffer: it returns the whole buffer, writes only this
            self.bytes_written += _scattered_bytes(name, args)
        elif name not in VIEW_OPS:
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    self.bytes_written += t.numel() * t.element_size()
        return out

    def split(self) -> tuple[int, int]:
        """(kernel ops, host syncs) counted so far."""
        kernels = sum(n for op, n in self.ops.items() if op not in VIEW_OPS)
        return kernels, sum(self.ops[op] for op in SYNC_OPS)


def kvzap_cache(cfg: Any, mc: Any) -> Any:
    """KVzap with a freshly initialised MLP surrogate (D_h / 8 wide, the paper's) and threshold 0: random hidden
    states then score about half of the new rows below it, so about half of the rows leaving the window are evicted,
    as at KVzap's ~2× operating point. The surrogate's cost is part of the policy's bookkeeping."""
    surrogate = KVzapModel(KVzapConfig(input_dim=mc.hidden_size, output_dim=mc.num_key_value_heads,
                                       n_modules=mc.num_hidden_layers, hidden_dim=mc.hidden_size // 8))  # fmt: skip
    return KVzapCache(dataclasses.replace(cfg, threshold=0.0), mc, surrogate=surrogate.eval())


def steady_rows(cfg: Any, context: int, prompt: int) -> int:
    """Rows a policy holds per (b, h) after ``context`` fed tokens (a ``prompt``-token prompt)."""
    if getattr(cfg, "policy", None) == "evict_block":
        gen = context - prompt
        return prompt + (gen // cfg.block_size) * cfg.quota + gen % cfg.block_size
    budget = getattr(cfg, "budget_rows", None)
    if budget is None or getattr(cfg, "policy", None) == "snapkv":  # SnapKV compresses the prompt only
        return context
    return min(context, budget)


class Simulation:
    """One policy's cache at steady state, driven through the decode protocol without a model."""

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        self.name, self.args = name, args
        self.cfg = method_config(name, args.budget)
        mc = SimpleNamespace(num_hidden_layers=args.layers, num_attention_heads=args.q_heads,
                             num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
                             hidden_size=args.q_heads * args.head_dim, rope_theta=10000.0)  # fmt: skip
        self.kvzap = name == "kvzap"
        self.cache = kvzap_cache(self.cfg, mc) if self.kvzap else build_policy(self.cfg, mc)
        B, H, d, dt = args.batch, args.kv_heads, args.head_dim, DTYPES[args.dtype]
        self.rows = steady_rows(self.cfg, args.context, args.prompt)
        c, dev = self.cache, torch.device("cpu")
        c.compute_device, c.dtype = dev, dt
        C = args.context
        c.lengths = torch.full((B,), C, dtype=torch.long)
        c.fed = torch.full((B,), C, dtype=torch.long)
        c.prompt_lengths = torch.full((B,), args.prompt, dtype=torch.long)
        c.steps_done = 1
        if hasattr(c, "decode_steps"):
            c.decode_steps = C - args.prompt
        gen = torch.Generator().manual_seed(0)
        first = C - self.rows  # the held rows are the newest ones (their feed order / positions)
        for layer in c.layers:
            layer.store = c.new_store(B, dt, dev)
            for s in range(0, self.rows, 2048):
                m = min(2048, self.rows - s)
                order = (first + s + torch.arange(m)).expand(B, m)
                k = torch.randn(B, H, m, d, generator=gen).to(dt)
                layer.store.append(k, k, order, order, torch.ones(B, m, dtype=torch.bool), all_valid=True)
            for a in layer.store.attr_names:  # accumulated scores of a long run: positive, varied
                layer.store.set_attr(a, torch.rand(B, H, self.rows, generator=gen))
            if self.kvzap:  # ragged: each (b, h) keeps its share of the older rows, every row of the window
                share = torch.empty(B, H, 1).uniform_(*KVZAP_KEPT, generator=gen)
                old = torch.arange(self.rows) < self.rows - self.cfg.window
                layer.store.retain(~old | (torch.rand(B, H, self.rows, generator=gen) < share))
                # predicted scores about the threshold: the window's rows go half the time as they leave it; the
                # older rows held survived it (scores above)
                n, score = layer.store.n, torch.randn(B, H, layer.store.n_max, generator=gen)
                older = torch.arange(score.shape[-1]) < (n - self.cfg.window)[..., None]
                layer.store.set_attr(layer.store.attr_names[0], torch.where(older, score.abs(), score))
        if self.kvzap:
            self.rows = int(self.cache.resident_rows().float().mean())
            self.hidden = torch.randn(64, B, 1, mc.hidden_size, generator=gen).to(dt)  # cycled: fresh scores
        self.k_new = torch.randn(B, H, 1, d, generator=gen).to(dt)
        self.q = torch.randn(B, args.q_heads, 1, d, generator=gen).to(dt)
        w = torch.rand(B, args.q_heads, 1, self.rows + 1, generator=gen)
        self.weights = (w / w.sum(-1, keepdim=True)).to(dt)  # synthetic softmax rows, sliced to N each step
        self.valid = torch.ones(B, 1, dtype=torch.bool)
        self.t = 0  # steps run

    def step(self) -> None:
        c = self.cache
        c.begin_step(self.valid, input_ids=None, is_prefill=False)
        for i in range(len(c.layers)):
            if self.kvzap:
                c.on_attention_input(i, self.hidden[self.t % len(self.hidden)])
            keys, _ = c.update(self.k_new, self.k_new, i)
            _lookup(keys)  # what the attention function does with the registered view
            layer = c.layers[i]
            layer.attended = True
            c.on_queries(layer, self.q)
            if c.wants_attention_weights(layer):
                N = keys.shape[-2]
                c.on_attention(layer, self.weights[..., :N] if self.weights.shape[-1] >= N else
                               torch.full((*self.weights.shape[:-1], N), 1.0 / N, dtype=self.weights.dtype))  # fmt: skip
            c.after_attention(layer)
        c.end_step()
        self.t += 1

    def resident_kv_bytes(self) -> float:
        """Mean K/V bytes per layer per sequence-batch held now (for the step projection)."""
        rows = float(self.cache.resident_rows().float().mean())
        a = self.args
        return rows * a.batch * a.kv_heads * a.head_dim * 2 * 2  # served in bf16


@torch.no_grad()
def measure(name: str, args: argparse.Namespace) -> dict[str, Any]:
    sim = Simulation(name, args)
    count_steps = min(args.steps, 64)
    bar = tqdm(total=args.warmup + args.steps + count_steps, desc=f"{name} steps", leave=False)
    for _ in range(args.warmup):
        sim.step()
        bar.update()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        sim.step()
        times.append(time.perf_counter() - t0)
        bar.update()  # outside the timed span
    counter = _CountOps()
    for _ in range(count_steps):
        with counter:  # only the step is counted, not the bar
            sim.step()
        bar.update()
    bar.close()
    L = args.layers
    kernels, syncs = counter.split()
    ops, syncs = kernels / (count_steps * L), syncs / (count_steps * L)
    # bytes the kernels write per layer per step, at bf16 (the simulation may run in fp32)
    written = counter.bytes_written / (count_steps * L) * 2 / DTYPES[args.dtype].itemsize
    cpu_us = 1e6 * statistics.mean(times) / L
    kv_layer = sim.resident_kv_bytes()
    step_s = (WEIGHT_BYTES_7B + PAPER_LAYERS * kv_layer) / (args.bandwidth_tbs * 1e12)
    gpu_us = ops * args.launch_us + 1e6 * 2 * written / (
        args.bandwidth_tbs * 1e12
    )  # launches + read/write traffic
    row = {
        "policy": name, "rows": sim.rows, "mean_us_per_layer": cpu_us,
        "median_us_per_layer": 1e6 * statistics.median(times) / L, "max_us_per_layer": 1e6 * max(times) / L,
        "ops_per_layer": ops, "syncs_per_layer": syncs, "bytes_written_per_layer": written,
        "top_ops": {k: v / (count_steps * L) for k, v in counter.ops.most_common(8)},
        "h100_step_ms": 1e3 * step_s, "gpu_overhead_ms": PAPER_LAYERS * gpu_us / 1e3,
        "gpu_overhead_over_step": PAPER_LAYERS * gpu_us * 1e-6 / step_s,
        "cpu_overhead_over_step": PAPER_LAYERS * cpu_us * 1e-6 / step_s,
    }  # fmt: skip
    print(f"  {name:<16} rows {sim.rows:>6}  {cpu_us:9.1f} µs/layer/step (median {row['median_us_per_layer']:.1f})  "
          f"{ops:6.1f} ops/layer  ÷ H100 step: {row['gpu_overhead_over_step']:.3f} (GPU estimate), "
          f"{row['cpu_overhead_over_step']:.3f} (CPU-time bound)", flush=True)  # fmt: skip
    del sim
    return row


def table(report: dict[str, Any]) -> str:
    a = report["args"]
    lines = [
        f"Simulated policy bookkeeping: batch {a['batch']}, context {a['context']}, {a['kv_heads']} KV heads / "
        f"{a['q_heads']} query heads, head_dim {a['head_dim']}, {a['dtype']}, budget {a['budget']} rows, "
        f"{a['steps']} timed steps, 1 CPU thread. Projection: 32 layers, 7.6 B-parameter bf16 model at "
        f"{a['bandwidth_tbs']} TB/s (ideal bandwidth), {a['launch_us']} µs per eager op.",
        "",
        "| policy | rows | µs/layer/step (mean) | median | kernel ops/layer/step | host syncs | MB written/layer/step | "
        "H100 step ms | GPU overhead ms | overhead ÷ step (GPU estimate) | overhead ÷ step (CPU time) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['policy']} | {r['rows']} | {r['mean_us_per_layer']:.1f} | {r['median_us_per_layer']:.1f} | "
            f"{r['ops_per_layer']:.1f} | {r['syncs_per_layer']:.1f} | {r['bytes_written_per_layer'] / 1e6:.2f} | "
            f"{r['h100_step_ms']:.2f} | {r['gpu_overhead_ms']:.2f} | "
            f"{r['gpu_overhead_over_step']:.3f} | {r['cpu_overhead_over_step']:.3f} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=16384)
    p.add_argument("--prompt", type=int, default=256, help="prompt tokens of the context")
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--q-heads", type=int, default=32)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=1, help="layers simulated (cost is reported per layer)")
    p.add_argument(
        "--budget", type=int, default=1024, help="budget_rows of every budgeted policy (conf default)"
    )
    p.add_argument("--steps", type=int, default=256, help="timed decode steps (cover compaction periods)")
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default="float32",
        help="dtype of the simulated stores (CPU kernels are fastest in fp32; the projection uses bf16 bytes)",
    )
    p.add_argument("--policies", nargs="+", default=POLICIES)
    p.add_argument("--bandwidth-tbs", type=float, default=H100_BANDWIDTH / 1e12, help="HBM bandwidth, TB/s")
    p.add_argument(
        "--launch-us", type=float, default=5.0, help="GPU cost of one eager op (dispatch + launch)"
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=output_dir, default=None)
    args = p.parse_args(argv)
    require_at_least(p, args, 1, "batch", "context", "kv_heads", "q_heads", "head_dim", "layers", "budget", "steps",
                     "threads")  # fmt: skip
    require_at_least(p, args, 0, "warmup")
    if not (math.isfinite(args.bandwidth_tbs) and args.bandwidth_tbs > 0):
        p.error(f"--bandwidth-tbs must be a positive number of TB/s, got {args.bandwidth_tbs}")
    if not (math.isfinite(args.launch_us) and args.launch_us >= 0):
        p.error(f"--launch-us must be a number of µs >= 0, got {args.launch_us}")
    if args.q_heads % args.kv_heads:
        p.error("--q-heads must be a multiple of --kv-heads")
    if not 0 < args.prompt < args.context:
        p.error("need 0 < --prompt < --context")
    check_conf_names(p, args.policies)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    out = bench_out_dir(args.out, "bench_policy_overhead")
    rows = [measure(name, args) for name in args.policies]
    report = {"args": vars(args), "weight_bytes": WEIGHT_BYTES_7B, "paper_layers": PAPER_LAYERS, "rows": rows}
    write_bench_report(out, "policy_overhead", report, table(report))
    return report


if __name__ == "__main__":
    from zoomr.script import run_script

    run_script(main)
