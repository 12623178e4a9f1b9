"""Decode throughput per policy vs batch size, and time to finish each arm's own requests (AbridgeKV Fig. 3b, 3d).

    python -m analysis.bench_throughput [--policies full streaming h2o] [--batch-sizes 1 8 32] \
        [--eval-runs runs/eval/suite/<model>/*] [--out DIR] [--quick]

Part 1, throughput: every policy decodes the same random prompts through the batched engine
(:func:`zoomr.engine.generate`, no early stop) at each batch size; tokens/s = batch x new tokens / wall
time, also as a ratio to full KV at the same batch size (all arms in this process, same threads).

Part 2, time to finish (``--eval-runs``): for each evaluation run directory, its own cache policy (the
run's ``method`` config, none = full KV) and model decode ``--requests`` requests whose prompt lengths and
generation lengths are those of the run's first result rows (the paper replays each arm's own suite
lengths); a slim copy decodes with the checkpoint it names as ``model.evaluated_checkpoint``, which must be
here. Static batching: requests are sorted by generation length and decoded up to a concurrency cap at a
time, each batch until its longest request; every cap of ``--finish-caps`` is tried and the fastest is the
arm's time (the paper's "concurrency cap that finishes fastest"). Paired with accuracy it gives Figure 3d.

Writes ``bench_throughput.json`` and ``bench_throughput.md`` under ``--out`` (default
``./runs/bench_throughput``) and prints the tables. W&B: ``--logger wandb`` (offline without a key).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from analysis.bench_decode import check_conf_names, method_config, model_spec
from analysis.slim_runs import evaluated_checkpoint, evaluated_config
from zoomr.engine import DecodeSettings, generate
from zoomr.jsonl import read_json_object
from zoomr.models import load_model, load_model_and_tokenizer, load_tokenizer, spec_from_dict
from zoomr.paths import output_dir

DEFAULT_POLICIES = ["full", "streaming", "h2o", "snapkv"]


def random_prompts(vocab: int, lengths: list[int], seed: int) -> list[list[int]]:
    """Token-id prompts of the given lengths (ids 200..vocab-1, clear of the special tokens)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(200, vocab, (n,), generator=g).tolist() for n in lengths]


def timed_generate(model, tokenizer, prompts: list[list[int]], policy: Any, new_tokens: int, seed: int) -> float:
    """Wall seconds to decode ``new_tokens`` for every prompt (no stop tokens, greedy)."""
    settings = DecodeSettings(
        max_new_tokens=new_tokens, temperature=0.0, seed=seed, stop_token_ids=[], progress=False
    )
    t0 = time.perf_counter()
    outs = generate(model, tokenizer, prompts, policy, settings)
    seconds = time.perf_counter() - t0
    if any(o.n_tokens != new_tokens for o in outs):
        raise RuntimeError(f"expected {new_tokens} tokens per sequence, got {[o.n_tokens for o in outs]}")
    return seconds


def throughput(model, tokenizer, policies: dict[str, Any], batch_sizes: list[int], prompt_tokens: int,
               new_tokens: int, repeats: int) -> dict[str, dict[str, dict[str, float]]]:  # fmt: skip
    """policy -> batch size -> {tokens_per_s, seconds, ratio_vs_full}; the best of ``repeats`` runs."""
    vocab = len(tokenizer)
    out: dict[str, dict[str, dict[str, float]]] = {name: {} for name in policies}
    jobs = [(b, name) for b in batch_sizes for name in policies]
    for b, name in tqdm(jobs, desc="throughput (batch x policy)"):
        prompts = random_prompts(vocab, [prompt_tokens] * b, seed=b)
        timed_generate(model, tokenizer, prompts[:1], policies[name], 2, 0)  # warm-up
        best = min(
            timed_generate(model, tokenizer, prompts, policies[name], new_tokens, r) for r in range(repeats)
        )
        out[name][str(b)] = {"seconds": best, "tokens_per_s": b * new_tokens / best}
    if "full" in out:
        for name in out:
            for b, r in out[name].items():
                r["ratio_vs_full"] = r["tokens_per_s"] / out["full"][b]["tokens_per_s"]
    return out


def eval_requests(run_dir: Path, n: int) -> tuple[dict[str, Any], list[tuple[int, int]]]:
    """(resolved config, [(prompt tokens, generated tokens)] of the first ``n`` result rows) of an eval run."""
    config_file, results = run_dir / "config.json", run_dir / "results.jsonl"
    if not config_file.exists() or not results.exists():
        raise SystemExit(f"{run_dir}: not an evaluation run directory (needs config.json and results.jsonl)")
    config = read_json_object(config_file, "run config")
    ckpt = evaluated_checkpoint(config)  # a slim copy (analysis/slim_runs.py) names the checkpoint it was run on
    if ckpt is not None and not Path(ckpt).is_dir():
        raise SystemExit(f"{run_dir}: a slim copy whose checkpoint {ckpt} is not here; "
                         "time it where that checkpoint is (python -m analysis +task=miniature trains it)")
    config = evaluated_config(config)
    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    if not rows:
        raise SystemExit(f"{run_dir}: results.jsonl holds no rows yet")
    return config, [(int(r["prompt_tokens"]), int(r["n_tokens"])) for r in rows[:n]]


def time_to_finish(run_dir: Path, n_requests: int, caps: list[int], cache_dir: str | None) -> dict[str, Any]:
    """Wall time to serve the run's requests with its own policy and model, at each concurrency cap (static
    batches of up to ``cap`` requests by length); the fastest cap is the arm's time (AbridgeKV §4: "run to
    completion at the concurrency cap that finishes fastest")."""
    config, requests = eval_requests(run_dir, n_requests)
    spec = spec_from_dict(config["model"])
    model, tokenizer = load_model(spec, cache_dir), load_tokenizer(spec, cache_dir)
    policy = config.get("method") or {"policy": "full"}
    order = sorted(range(len(requests)), key=lambda i: requests[i][1])
    by_cap: dict[str, float] = {}
    for cap in caps:
        seconds = 0.0
        for start in range(0, len(order), cap):
            chunk = [requests[i] for i in order[start : start + cap]]
            prompts = random_prompts(len(tokenizer), [p for p, _ in chunk], seed=start)
            seconds += timed_generate(model, tokenizer, prompts, policy, max(g for _, g in chunk), start)
        by_cap[str(cap)] = seconds
    best = min(by_cap, key=by_cap.get)
    return {
        "run_dir": str(run_dir),
        "arm": config.get("run_name") or (policy.get("name") or "full"),
        "model": config["model"]["name"],
        "benchmark": config["benchmark"]["name"],
        "policy": policy.get("policy", "full"),
        "requests": len(requests),
        "generated_tokens": sum(g for _, g in requests),
        "seconds_by_cap": by_cap,
        "batch": int(best),
        "seconds": by_cap[best],
        "seconds_per_request": by_cap[best] / len(requests),
    }


def tables(report: dict[str, Any]) -> str:
    tp = report["throughput"]
    sizes = list(next(iter(tp.values())).keys()) if tp else []
    lines = ["| policy | " + " | ".join(f"tok/s b={b} (÷ full)" for b in sizes) + " |", "|---" * (len(sizes) + 1) + "|"]
    for name, per in tp.items():
        cells = [f"{r['tokens_per_s']:.0f} ({r.get('ratio_vs_full', float('nan')):.2f})" for r in per.values()]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if report["finish"]:
        full = next((r["seconds"] for r in report["finish"] if r["policy"] == "full"), None)
        lines += ["", "| arm | model | benchmark | requests | generated tokens | best cap | seconds | ÷ full |",
                  "|---" * 8 + "|"]  # fmt: skip
        for r in report["finish"]:
            ratio = f"{r['seconds'] / full:.2f}" if full else "—"
            lines.append(
                f"| {r['arm']} | {r['model']} | {r['benchmark']} | {r['requests']} | {r['generated_tokens']} "
                f"| {r['batch']} | {r['seconds']:.2f} | {ratio} |"
            )
    return "\n".join(lines)


QUICK = {"batch_sizes": [1, 8], "new_tokens": 32, "prompt_tokens": 64, "repeats": 1, "requests": 8, "finish_caps": [2, 8],
         "policies": ["full", "streaming", "h2o"]}  # fmt: skip
DEFAULTS = {"batch_sizes": [1, 8, 32], "new_tokens": 128, "prompt_tokens": 128, "repeats": 2, "requests": 32,
            "finish_caps": [1, 2, 4, 8], "policies": DEFAULT_POLICIES}  # fmt: skip


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m analysis.bench_throughput", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny-qwen2", help="a conf/model/<name>.yaml (part 1)")
    p.add_argument("--policies", nargs="+", default=None, help=f"conf/method names (default {DEFAULT_POLICIES})")
    p.add_argument("--budget", type=int, default=32, help="budget_rows of every budgeted policy (part 1)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=None, help="default 1 8 32")
    p.add_argument("--prompt-tokens", type=int, default=None, help="default 128")
    p.add_argument("--new-tokens", type=int, default=None, help="default 128")
    p.add_argument("--repeats", type=int, default=None, help="default 2")
    p.add_argument("--eval-runs", nargs="*", default=[], help="evaluation run directories (part 2)")
    p.add_argument("--requests", type=int, default=None, help="requests per eval run (its first result rows; default 32)")
    p.add_argument("--finish-caps", type=int, nargs="+", default=None,
                   help="concurrency caps tried per eval run (a doubling grid, default 1 2 4 8); the fastest is its time")  # fmt: skip
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--quick", action="store_true",
                   help="defaults batch 1 and 8, 64 + 32 tokens, 1 repeat, 8 requests, caps 2 8 (what is given wins)")  # fmt: skip
    p.add_argument("--out", type=output_dir, default="runs/bench_throughput", help="output directory (relative to the cwd)")
    p.add_argument("--logger", choices=["wandb", "none"], default="none", help="wandb: offline without a key")
    args = p.parse_args(argv)
    for k, v in (QUICK if args.quick else DEFAULTS).items():  # --quick fills only what was not given
        if getattr(args, k) is None:
            setattr(args, k, v)
    if min(args.batch_sizes + args.finish_caps + [args.new_tokens, args.prompt_tokens, args.requests, args.repeats]) < 1:
        p.error("--batch-sizes, --finish-caps, --new-tokens, --prompt-tokens, --requests and --repeats must be >= 1")
    if args.budget >= args.prompt_tokens + args.new_tokens:
        p.error(f"--budget {args.budget} never evicts at {args.prompt_tokens}+{args.new_tokens} tokens: lower it")
    check_conf_names(p, args.policies, args.model)
    missing = [str(r) for r in args.eval_runs if not (Path(r) / "config.json").exists()]
    if missing:
        p.error(f"not evaluation run directories (no config.json): {', '.join(missing)}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer = load_model_and_tokenizer(model_spec(args.model), args.cache_dir)
    policies = {name: method_config(name, args.budget) for name in args.policies}
    report: dict[str, Any] = {
        "meta": {
            **{k: v for k, v in vars(args).items() if k != "eval_runs"},
            "threads": torch.get_num_threads(),
            "omp": os.environ.get("OMP_NUM_THREADS"),
            "device": str(next(model.parameters()).device),
            "unix_time": time.time(),
        },
        "throughput": throughput(
            model, tokenizer, policies, args.batch_sizes, args.prompt_tokens, args.new_tokens, args.repeats
        ),
        "finish": [],
    }
    for run_dir in tqdm(args.eval_runs, desc="time to finish (eval runs)"):
        report["finish"].append(time_to_finish(Path(run_dir), args.requests, args.finish_caps, args.cache_dir))
        (out / "bench_throughput.json").write_text(json.dumps(report, indent=2))  # keep finished arms
    (out / "bench_throughput.json").write_text(json.dumps(report, indent=2))
    text = tables(report)
    (out / "bench_throughput.md").write_text(text + "\n")
    print("\n" + text + f"\n\nwritten {out / 'bench_throughput.json'}, {out / 'bench_throughput.md'}")
    if args.logger == "wandb":
        report["wandb_summary"] = log_to_wandb(report, args.model, out)
    return report


def log_to_wandb(report: dict[str, Any], model: str, out: Path) -> dict[str, Any]:
    """Summary metrics under the key scheme of :mod:`zoomr.tracking` (job type ``bench``)."""
    from zoomr.tracking import log_summary_run

    metrics = {f"tokens_per_s/{p}/b{b}": r["tokens_per_s"] for p, per in report["throughput"].items() for b, r in per.items()}
    metrics |= {f"time_to_finish_s/{r['arm']}": r["seconds"] for r in report["finish"]}
    return log_summary_run(job_type="bench", name=f"bench_throughput-{model}", group=f"{model}/bench", config=report["meta"],
                    metrics=metrics, dir=out)  # fmt: skip


if __name__ == "__main__":
    from zoomr.script import run_script

    run_script(main)
