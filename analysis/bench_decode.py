"""Decode benchmark: every cache policy vs full KV and vs transformers' own caches, in one process.

    python -m analysis.bench_decode --quick [--out DIR]          # 1K and 4K, batch 1 and 8 (≤ 3 min)
    python -m analysis.bench_decode [--model tiny-qwen2] [--contexts 1024 4096 8192] [--batches 1 8]
                                    [--decode-steps 32] [--budget 512] [--context-mode generated|prompt]
                                    [--repeats 3] [--threads 1] [--out DIR]

For each (context C, batch B) every policy's cache is filled with the same B × C random tokens: by default
(``generated``) a short prompt (``--prompt-tokens``) and the rest fed as generation-phase chunks of
``--prefill-chunk`` tokens (so decode-time policies compress it as they would a long reasoning trace; SnapKV,
a prefill method, then keeps it all); ``prompt`` prefills all C tokens. Then greedy decode steps are timed
(the model forward with the cache's work inside it). The machine is shared, so timing is *paired and
interleaved*: every cache is filled first, then ``--repeats`` rounds of ``--decode-steps`` steps in which every
runner takes one step in turn; ``step_ms`` is the minimum over rounds of a runner's median step (``mean_ms``:
of its mean, which includes amortised bursts such as R-KV's compaction), and every ratio is the median over
rounds of the two runners' same-round medians (a burst of load on the machine hits both).

Reference policies, run through the same loop with transformers' SDPA attention: ``hf_dynamic``
(``DynamicCache``) and ``hf_sliding_window`` (``DynamicSlidingWindowLayer`` keeping the streaming budget,
i.e. the rows StreamingLLM keeps without sinks). Rows: ``ratio_vs_full``, ``ratio_vs_hf_dynamic``,
``rows_over_full`` (mean resident rows ÷ full KV's), ``bytes_over_full`` (bytes held, measured from the
tensors the cache holds), ``select_share`` (share of step time spent selecting), and
``ratio_vs_hf_sliding_window`` on streaming / h2o rows. The end-to-end part times
``zoomr.engine.generate(full)`` against ``model.generate(DynamicCache)`` (same prompts, greedy, same number
of new tokens) — ``e2e`` in the JSON. Budgeted policies get ``budget_rows = --budget``; other
hyperparameters come from ``conf/method/<name>.yaml``.

Prints a table and writes ``DIR/bench_decode.json`` + ``DIR/bench_decode.md`` (``--out DIR``; default
``runs/bench_decode/<model>-<time>/`` under the working directory).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from typing import Any

import torch
from omegaconf import OmegaConf
from tqdm.auto import tqdm

from analysis.cli import bench_out_dir, require_at_least, require_device, write_bench_report
from zoomr import configs
from zoomr.cache import build_policy
from zoomr.decode_forward import DecoderForward
from zoomr.models import load_model_and_tokenizer, spec_from_dict
from zoomr.paths import REPO_ROOT

POLICIES = [
    "full", "offload", "streaming", "h2o", "snapkv", "rkv", "rkv_serving",
    "evict_recency", "evict_random", "evict_attention",
]  # fmt: skip
REFERENCES = ["hf_dynamic", "hf_sliding_window"]
QUICK = {"contexts": [1024, 4096], "batches": [1, 8], "decode_steps": 16, "repeats": 3}


def method_config(name: str, budget: int) -> Any:
    """``conf/method/<name>.yaml`` as its policy's config, a fixed budget set to ``budget`` rows."""
    cfg = configs.method_config(name)
    if getattr(cfg, "budget_rows", None) is not None:
        cfg = dataclasses.replace(cfg, budget_rows=budget)
    return cfg


def check_conf_names(p: argparse.ArgumentParser, policies: list[str], model: str | None = None) -> None:
    """Refuse (``p.error``) a policy or model that has no ``conf/method`` / ``conf/model`` YAML, before anything
    loads (a bench found it only when it built the policy: a ValueError traceback after loading the model)."""
    unknown = [n for n in policies if n not in configs.available("method")]
    if unknown:
        p.error(f"unknown policies {unknown} (no conf/method/<name>.yaml)")
    if model is not None and model not in configs.available("model"):
        p.error(f"--model {model}: no conf/model/{model}.yaml")


def model_spec(name: str):
    raw = OmegaConf.to_container(OmegaConf.load(REPO_ROOT / "conf" / "model" / f"{name}.yaml"), resolve=True)
    raw.pop("defaults", None)
    return spec_from_dict(raw)


class _Runner:
    """One cache filled with the context, able to run timed greedy decode steps (its own token stream)."""

    name: str

    def step(self) -> None:
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        return {}


class PolicyRunner(_Runner):
    """A zoomr policy cache driven step by step (``begin_step`` / forward / ``end_step``), as the engine does
    (the engine's :class:`~zoomr.decode_forward.DecoderForward`)."""

    def __init__(self, name: str, model, cfg: Any, ids: torch.Tensor, args: argparse.Namespace) -> None:
        self.name, self.model = name, model
        self.forward = DecoderForward(model)
        self.cache = build_policy(cfg, model.config)
        C = ids.shape[1]
        P = C if args.context_mode == "prompt" else min(args.prompt_tokens, C)
        chunk = args.prefill_chunk or C
        for s in range(0, P, chunk):
            logits = self._feed(ids[:, s : min(P, s + chunk)], prefill=True, last=min(P, s + chunk) == P)
        for s in range(P, C, chunk):  # the rest arrives as generated text would, chunk by chunk
            logits = self._feed(ids[:, s : s + chunk], prefill=False)
        self.tok = logits[:, -1:].argmax(-1)
        self.cache.pop_select_seconds()
        self.select_s = 0.0
        self.rows: list[float] = []

    def _feed(self, x: torch.Tensor, prefill: bool, last: bool = False) -> torch.Tensor:
        step = self.cache.begin_step(
            torch.ones_like(x, dtype=torch.bool), input_ids=x, is_prefill=prefill, ends_prefill=last
        )
        logits = self.forward(x, step.positions, self.cache, keep_last=True)
        self.cache.end_step()
        return logits

    def step(self) -> None:
        self.tok = self._feed(self.tok, prefill=False)[:, -1:].argmax(-1)

    def after_block(self) -> None:
        self.select_s += self.cache.pop_select_seconds()
        self.rows.append(float(self.cache.resident_rows().float().mean()))

    def stats(self) -> dict[str, Any]:
        held = self.cache.resident_bytes()
        return {
            "rows": statistics.mean(self.rows),
            "bytes": held["device"] + held["host"],
            "device_bytes": held["device"],
            "host_bytes": held["host"],
        }


class HFRunner(_Runner):
    """transformers' own cache (``DynamicCache``, or sliding-window layers) with SDPA, in a plain loop."""

    def __init__(self, name: str, model, ids: torch.Tensor, chunk: int, window: int | None) -> None:
        from transformers import DynamicCache
        from transformers.cache_utils import Cache, DynamicSlidingWindowLayer

        self.name, self.model = name, model
        if window is None:
            self.cache = DynamicCache(config=model.config)
        else:  # keeps window - 1 rows between steps: window = budget + 1 keeps the streaming budget
            self.cache = Cache(
                layers=[
                    DynamicSlidingWindowLayer(sliding_window=window)
                    for _ in range(model.config.num_hidden_layers)
                ]
            )
        with _sdpa(model):
            for s in range(0, ids.shape[1], chunk):
                logits = model(
                    ids[:, s : s + chunk], cache=self.cache, use_cache=True, logits_to_keep=1
                ).logits
        self.tok = logits[:, -1:].argmax(-1)

    def step(self) -> None:
        self.tok = self.model(self.tok, cache=self.cache, use_cache=True).logits[:, -1:].argmax(-1)

    def stats(self) -> dict[str, Any]:
        keys = [layer.keys for layer in self.cache.layers]
        return {"rows": float(sum(k.shape[-2] for k in keys) / len(keys))}


class _sdpa:
    """Context: run the model with transformers' SDPA attention (restored after)."""

    def __init__(self, model) -> None:
        self.model = model

    def __enter__(self):
        self.previous = self.model.config._attn_implementation
        self.model.set_attn_implementation("sdpa")

    def __exit__(self, *exc) -> None:
        self.model.set_attn_implementation(self.previous)


def time_block(runner: _Runner, steps: int, sync) -> list[float]:
    times = []
    for _ in range(steps):
        sync()
        t0 = time.perf_counter()
        runner.step()
        sync()
        times.append(time.perf_counter() - t0)
    return times


@torch.no_grad()
def bench_point(model, ctx: int, batch: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """All policies and references at one (context, batch): fill every cache, then interleaved timed rounds."""
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, min(4000, model.config.vocab_size), (batch, ctx), generator=gen).to(device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    runners: list[_Runner] = []
    # one bar per (context, batch): the caches filled (prefill), then the interleaved timed steps; it advances
    # between timed blocks only
    bar = tqdm(total=len(args.policies) + 2 * args.hf_reference + args.repeats * args.decode_steps,
               desc=f"ctx {ctx} B{batch}: fill, then timed steps", leave=False)  # fmt: skip
    for name in args.policies:
        runners.append(PolicyRunner(name, model, method_config(name, args.budget), ids, args))
        bar.update()
    if args.hf_reference:
        chunk = args.prefill_chunk or ctx
        runners.append(HFRunner("hf_dynamic", model, ids, chunk, None))
        runners.append(HFRunner("hf_sliding_window", model, ids, chunk, args.budget + 1))
        bar.update(2)
    for r in runners:  # warm-up: allocator, caches reaching their steady state
        with _sdpa(model) if isinstance(r, HFRunner) else _null():
            time_block(r, 2, sync)
    med: dict[str, list[float]] = {r.name: [] for r in runners}
    mean: dict[str, list[float]] = {r.name: [] for r in runners}
    for _ in range(args.repeats):  # one round: every runner's steps interleaved step by step
        times: dict[str, list[float]] = {r.name: [] for r in runners}
        for _ in range(args.decode_steps):
            for r in runners:
                with _sdpa(model) if isinstance(r, HFRunner) else _null():
                    times[r.name] += time_block(r, 1, sync)
            bar.update()
        for r in runners:
            med[r.name].append(statistics.median(times[r.name]))
            mean[r.name].append(statistics.mean(times[r.name]))
            if isinstance(r, PolicyRunner):
                r.after_block()
    bar.close()
    rows = []
    for r in runners:
        row = {"policy": r.name, "context": ctx, "batch": batch, "step_ms": 1e3 * min(med[r.name]),
               "mean_ms": 1e3 * min(mean[r.name]), **r.stats()}  # fmt: skip
        if isinstance(r, PolicyRunner):
            total = sum(mean[r.name]) * args.decode_steps
            row["select_share"] = r.select_s / total if total else 0.0
        rows.append(row)

    def paired(name: str, ref: str) -> float:
        """Median over rounds of the ratio of the two runners' medians in the same round (interleaved)."""
        return statistics.median(a / b for a, b in zip(med[name], med[ref]))

    full = next(row for row in rows if row["policy"] == "full")
    names = {row["policy"] for row in rows}
    for row in rows:
        row["ratio_vs_full"] = paired(row["policy"], "full")
        if "hf_dynamic" in names:
            row["ratio_vs_hf_dynamic"] = paired(row["policy"], "hf_dynamic")
        row["rows_over_full"] = row["rows"] / full["rows"]
        if "bytes" in row:
            row["bytes_over_full"] = row["bytes"] / full["bytes"]
        if row["policy"] in ("streaming", "h2o") and "hf_sliding_window" in names:
            row["ratio_vs_hf_sliding_window"] = paired(row["policy"], "hf_sliding_window")
    for row in rows:
        print(f"  ctx {ctx:>5} B{batch:<2} {row['policy']:<18} {row['step_ms']:8.2f} ms/step  "
              f"÷full {row['ratio_vs_full']:.2f}  ÷hf_dynamic {row.get('ratio_vs_hf_dynamic', float('nan')):.2f}  "
              f"rows÷full {row['rows_over_full']:.3f}", flush=True)  # fmt: skip
    return rows


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc) -> None:
        return None


@torch.no_grad()
def bench_generate(model, tokenizer, batch: int, prompt: int, new: int, repeats: int) -> dict[str, Any]:
    """End to end: ``zoomr.engine.generate(full)`` ÷ ``model.generate(DynamicCache)``, interleaved, min of N."""
    from transformers import DynamicCache

    from zoomr.engine import DecodeSettings, generate

    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, min(4000, model.config.vocab_size), (batch, prompt), generator=gen).to(device)
    settings = DecodeSettings(max_new_tokens=new, stop_token_ids=[], progress=False)

    def ours() -> tuple[float, list[list[int]]]:
        t0 = time.perf_counter()
        outs = generate(model, tokenizer, ids.tolist(), {"policy": "full"}, settings)
        return time.perf_counter() - t0, [o.token_ids for o in outs]

    def theirs() -> tuple[float, list[list[int]]]:
        with _sdpa(model):
            t0 = time.perf_counter()
            out = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), cache=DynamicCache(config=model.config),
                max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
            )  # fmt: skip
            dt = time.perf_counter() - t0
        return dt, out[:, prompt:].tolist()

    ours(), theirs()  # warm-up
    t_ours, t_theirs, same = [], [], True
    for _ in range(repeats):
        a, toks_a = ours()
        b, toks_b = theirs()
        t_ours.append(a)
        t_theirs.append(b)
        same = same and toks_a == toks_b
    return {
        "batch": batch, "prompt_tokens": prompt, "new_tokens": new,
        "engine_s": min(t_ours), "hf_generate_s": min(t_theirs), "ratio": min(t_ours) / min(t_theirs),
        "same_tokens": same,
    }  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    t_start, cpu_start = time.perf_counter(), time.process_time()
    model, tokenizer = load_model_and_tokenizer(
        model_spec(args.model), args.cache_dir, device=args.device, attn_implementation="zoomr"
    )
    device = next(model.parameters()).device
    rows: list[dict[str, Any]] = []
    for ctx in args.contexts:
        for batch in args.batches:
            rows.extend(bench_point(model, ctx, batch, args))
    e2e = [
        bench_generate(model, tokenizer, b, args.e2e_prompt, args.e2e_new, args.repeats)
        for b in (args.batches if args.e2e else [])
    ]
    for e in e2e:
        print(f"  e2e B{e['batch']}: engine.generate(full) {e['engine_s']:.3f} s, model.generate(DynamicCache) "
              f"{e['hf_generate_s']:.3f} s, ratio {e['ratio']:.2f}, same tokens {e['same_tokens']}", flush=True)  # fmt: skip
    return {
        "model": args.model, "device": str(device), "threads": torch.get_num_threads(), "budget_rows": args.budget,
        "decode_steps": args.decode_steps, "prefill_chunk": args.prefill_chunk, "context_mode": args.context_mode,
        "prompt_tokens": args.prompt_tokens, "repeats": args.repeats, "quick": args.quick,
        "timing": "rounds of step-by-step interleaved runners; step_ms = min over rounds of the median step; "
        "ratios = median over rounds of same-round median ratios",
        "wall_s": time.perf_counter() - t_start, "cpu_s": time.process_time() - cpu_start, "rows": rows, "e2e": e2e,
    }  # fmt: skip


def table(report: dict[str, Any]) -> str:
    head = (
        f"model {report['model']} on {report['device']}, {report['threads']} thread(s), budget "
        f"{report['budget_rows']} rows, context as {report['context_mode']} ({report['prompt_tokens']}-token "
        f"prompt), {report['decode_steps']} timed steps × {report['repeats']} interleaved rounds "
        f"(step-interleaved, paired ratios), {report['wall_s']:.0f} s wall, {report.get('cpu_s', float('nan')):.0f} s CPU"
    )
    lines = [head, "", "| context | batch | policy | ms/step | ÷ full | ÷ hf_dynamic | ÷ hf_sliding | rows ÷ full | "
             "bytes ÷ full | select % |", "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip

    def f(x: Any, spec: str) -> str:
        return "" if x is None else format(x, spec)

    for r in report["rows"]:
        sel = r.get("select_share")
        lines.append(
            f"| {r['context']} | {r['batch']} | {r['policy']} | {r['step_ms']:.2f} | {r['ratio_vs_full']:.2f} | "
            f"{f(r.get('ratio_vs_hf_dynamic'), '.2f')} | {f(r.get('ratio_vs_hf_sliding_window'), '.2f')} | "
            f"{r['rows_over_full']:.3f} | {f(r.get('bytes_over_full'), '.3f')} | {f(None if sel is None else 100 * sel, '.1f')} |"
        )
    if report["e2e"]:
        lines += ["", "| e2e batch | prompt | new tokens | engine.generate(full) s | model.generate(DynamicCache) s | ratio | same tokens |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for e in report["e2e"]:
            lines.append(f"| {e['batch']} | {e['prompt_tokens']} | {e['new_tokens']} | {e['engine_s']:.3f} | "
                         f"{e['hf_generate_s']:.3f} | {e['ratio']:.2f} | {e['same_tokens']} |")  # fmt: skip
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny-qwen2", help="a conf/model/<name>.yaml")
    p.add_argument("--quick", action="store_true", help="contexts 1K/4K, batches 1/8, 16 steps × 3 rounds")
    p.add_argument("--contexts", type=int, nargs="+", default=None, help="default 1024 4096 8192")
    p.add_argument("--batches", type=int, nargs="+", default=None, help="default 1 8")
    p.add_argument("--decode-steps", type=int, default=None, help="timed steps per round (default 32)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 3)")
    p.add_argument("--budget", type=int, default=512, help="budget_rows of every budgeted policy")
    p.add_argument("--policies", nargs="+", default=POLICIES, help="conf/method/<name>.yaml names")
    p.add_argument("--prefill-chunk", type=int, default=512)
    p.add_argument("--context-mode", choices=["generated", "prompt"], default="generated",
                   help="generated: a short prompt, the rest fed as generation-phase chunks; prompt: all prefill")  # fmt: skip
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--no-hf-reference", dest="hf_reference", action="store_false")
    p.add_argument("--no-e2e", dest="e2e", action="store_false", help="skip engine.generate ÷ model.generate")
    p.add_argument("--e2e-prompt", type=int, default=256, help="prompt tokens of the end-to-end comparison")
    p.add_argument("--e2e-new", type=int, default=64, help="new tokens of the end-to-end comparison")
    p.add_argument(
        "--out", default=None, help="directory for bench_decode.json / .md (default under ./runs/)"
    )
    args = p.parse_args(argv)
    defaults = (
        QUICK
        if args.quick
        else {"contexts": [1024, 4096, 8192], "batches": [1, 8], "decode_steps": 32, "repeats": 3}
    )
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    require_at_least(p, args, 1, "decode_steps", "repeats", "budget", "batches", "threads", "prefill_chunk",
                     "prompt_tokens", "e2e_prompt", "e2e_new")  # fmt: skip
    if min(args.contexts) <= args.budget:
        p.error(f"every context must exceed --budget {args.budget}")
    check_conf_names(p, args.policies, args.model)
    require_device(p, args.device)
    if "full" not in args.policies:
        args.policies = ["full", *args.policies]
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out = bench_out_dir(args.out, "bench_decode", args.model)
    report = run(args)
    write_bench_report(out, "bench_decode", report, table(report))
    return report


if __name__ == "__main__":
    from zoomr.script import run_script

    run_script(main)
