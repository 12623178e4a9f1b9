"""``python -m eval.bench_grading``: grading throughput on MATH-500-style samples, timeouts enforced.

Builds ``--samples`` (default 4,000) samples from the MATH-500 reference solutions, 8 per problem, in
the mix a real run produces: correct boxed answers (exact stage), wrong boxed answers, long wrong
texts, texts whose answer is not boxed and truncated texts (math-verify stage), plus ``--pathological``
200 KB nested ``\\boxed{\\frac…}`` answers that must hit the timeout path. Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections import Counter
from pathlib import Path

from eval.benchmarks import load_source
from eval.grading import Grader, last_boxed

KINDS = ["correct", "correct", "correct", "unboxed", "wrong", "long_wrong", "truncated", "wrong"]


def _replace_last_boxed(text: str, new: str) -> str:
    pos = text.rfind("\\boxed")
    old = last_boxed(text)
    if pos < 0 or old is None:
        return text + f" \\boxed{{{new}}}"
    end = text.find("{", pos) + len(old) + 2
    return text[:pos] + f"\\boxed{{{new}}}" + text[end:]


def build_samples(n: int, n_pathological: int) -> list[tuple[str, str, str, str]]:
    """(kind, text, gold, task) quadruples."""
    problems = load_source("math500", "eval/data/benchmarks")
    depth = 200_000 // 10
    nested = "\\boxed{" + "\\frac{" * depth + "1" + "}{2}" * depth + "}"
    out = []
    for i in range(n):
        p = problems[(i // len(KINDS)) % len(problems)]
        other = problems[(i // len(KINDS) + 1) % len(problems)].answer
        kind = KINDS[i % len(KINDS)]
        sol = p.meta["solution"]
        if n_pathological and i % max(1, n // n_pathological) == n // max(1, n_pathological) - 1:
            kind, text = "pathological", nested
        elif kind == "correct":
            text = sol
        elif kind == "unboxed":
            text = (
                _replace_last_boxed(sol, "").replace("\\boxed{}", "") + f"\nThe final answer is ${p.answer}$."
            )
        elif kind == "wrong":
            text = _replace_last_boxed(sol, other)
        elif kind == "long_wrong":
            text = "\n\n".join([sol] * 8)
            text = _replace_last_boxed(text, other)
        else:  # truncated: the first half of the solution, no final answer
            text = sol[: len(sol) // 2]
        out.append((kind, text, p.answer, "math"))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.bench_grading", description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=4000)
    ap.add_argument("--pathological", type=int, default=20, help="200 KB nested answers among the samples")
    ap.add_argument("--workers", type=int, nargs="+", default=[2])
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--start-method", default="forkserver")
    ap.add_argument("--out", default="runs/bench/grading.json")
    args = ap.parse_args(argv)
    samples = build_samples(args.samples, args.pathological)
    kinds = Counter(k for k, *_ in samples)
    results = []
    for workers in args.workers:
        t0 = time.perf_counter()
        with Grader(workers, args.timeout, args.start_method) as grader:
            grades = grader.grade([s[1:] for s in samples])
            timeouts, restarts = grader.timeouts, grader.restarts
        seconds = time.perf_counter() - t0
        by_kind = {
            kind: {
                "samples": kinds[kind],
                "correct": sum(g.correct for (k, *_), g in zip(samples, grades) if k == kind),
                "grade_seconds": round(sum(g.seconds for (k, *_), g in zip(samples, grades) if k == kind), 2),
            }
            for kind in kinds
        }
        results.append(
            {
                "workers": workers,
                "seconds": round(seconds, 2),
                "samples_per_second": round(len(samples) / seconds, 1),
                "timeouts": timeouts,
                "worker_restarts": restarts,
                "methods": dict(Counter(g.method for g in grades)),
                "by_kind": by_kind,
            }
        )
    print(
        f"grading {len(samples)} MATH-500-style samples, timeout {args.timeout}s, {args.start_method} workers"
    )
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', '-')}")  # fmt: skip
    print("| workers | seconds | samples/s | timeouts | methods |\n|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['workers']} | {r['seconds']} | {r['samples_per_second']} | {r['timeouts']} | {r['methods']} |"
        )
    print("\n| kind | samples | correct | worker-side seconds (last config) |\n|---|---|---|---|")
    for kind, v in results[-1]["by_kind"].items():
        print(f"| {kind} | {v['samples']} | {v['correct']} | {v['grade_seconds']} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"samples": len(samples), "timeout_s": args.timeout, "results": results}, indent=2)
    )
    print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
