"""Training-step benchmark: one full-length optimiser step of a testbed-size model, eager fp32 vs the speed-ups the
miniature's training could take (bf16 autocast, ``torch.compile``), in one process.

    python -m analysis.bench_train_step [--model tiny-testbed] [--batch 8] [--seq 1024] [--steps 6]
                                        [--modes eager bf16 compile compile_bf16] [--threads 2] [--out FILE]

Every mode starts from the same weights (a copy of one model) and steps on the same random batch: forward
(``labels`` = inputs), backward and AdamW, as the trainers do. Reported per mode: the first step (compilation
included), the median of ``--steps`` steps after ``--warmup``, that median ÷ eager fp32's, and the first step's
loss (the same weights and batch, so it shows what the mode changes in the numerics). Prints a table and writes
JSON (default ``runs/bench_train_step/bench-<model>-<time>.json``). This is the measurement behind the README's
"from scratch" paragraph: training the miniature's models is compute-bound.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Any

import torch
from tqdm.auto import tqdm

from analysis.bench_decode import check_conf_names, model_spec
from analysis.cli import require_at_least, write_bench_json
from zoomr.models import load_model
from zoomr.paths import output_file

MODES = ("eager", "bf16", "compile", "compile_bf16")


def make_step(model: torch.nn.Module, batch: torch.Tensor, mode: str):
    """A closure running one optimiser step of ``model`` on ``batch`` in ``mode``; returns the loss."""
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def loss_of(m: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mode.endswith("bf16")):
            return m(input_ids=ids, labels=ids).loss

    forward = torch.compile(loss_of) if mode.startswith("compile") else loss_of

    def step() -> float:
        optimiser.zero_grad(set_to_none=True)
        loss = forward(model, batch)
        loss.backward()
        optimiser.step()
        return float(loss.detach())

    return step


def measure(model: torch.nn.Module, batch: torch.Tensor, mode: str, warmup: int, steps: int) -> dict[str, Any]:
    step = make_step(model, batch, mode)
    bar = tqdm(total=1 + warmup + steps, desc=f"train step {mode}", unit="step")
    t0 = time.perf_counter()
    first_loss = step()
    first_s = time.perf_counter() - t0
    bar.update()
    for _ in range(warmup):
        step()
        bar.update()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
        bar.update()
    bar.close()
    return {"mode": mode, "first_step_s": first_s, "step_median_s": statistics.median(times), "step_s": times,
            "first_loss": first_loss}  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    base = load_model(model_spec(args.model), args.cache_dir, device=torch.device("cpu")).train()
    batch = torch.randint(0, base.config.vocab_size, (args.batch, args.seq), generator=torch.Generator().manual_seed(args.seed))
    results = [measure(copy.deepcopy(base), batch, mode, args.warmup, args.steps) for mode in args.modes]
    eager = next((r for r in results if r["mode"] == "eager"), None)
    for r in results:
        r["step_ratio_vs_eager"] = eager["step_median_s"] / r["step_median_s"] if eager else None
        r["tokens_per_s"] = args.batch * args.seq / r["step_median_s"]
    return {
        "model": args.model, "params": sum(p.numel() for p in base.parameters()), "threads": torch.get_num_threads(),
        "batch": args.batch, "seq": args.seq, "warmup": args.warmup, "steps": args.steps, "torch": torch.__version__,
        "results": results,
    }  # fmt: skip


def table(report: dict[str, Any]) -> str:
    head = (
        f"model {report['model']} ({report['params'] / 1e6:.2f} M parameters), batch {report['batch']} x "
        f"{report['seq']} tokens, {report['threads']} thread(s), median of {report['steps']} steps after "
        f"{report['warmup']}; speed-up = eager fp32's median step ÷ the mode's"
    )
    lines = [head, "", "| mode | first step s | median step s | speed-up vs eager | tokens/s | first-step loss |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in report["results"]:
        ratio = f"{r['step_ratio_vs_eager']:.2f}x" if r["step_ratio_vs_eager"] else "-"
        lines.append(f"| {r['mode']} | {r['first_step_s']:.1f} | {r['step_median_s']:.3f} | {ratio} | "
                     f"{r['tokens_per_s']:,.0f} | {r['first_loss']:.4f} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="tiny-testbed", help="a conf/model/<name>.yaml")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cache-dir", default=None)
    p.add_argument("--out", type=output_file, default=None)
    args = p.parse_args(argv)
    require_at_least(p, args, 1, "batch", "seq", "steps", "threads")
    check_conf_names(p, [], args.model)
    require_at_least(p, args, 0, "warmup", "seed")
    report = run(args)
    write_bench_json(args.out, "bench_train_step", args.model, report, table(report))
    return report


if __name__ == "__main__":
    from zoomr.script import run_script

    run_script(main)
