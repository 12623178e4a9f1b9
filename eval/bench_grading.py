"""``python -m eval.bench_grading``: the grading pool against a plain single-process math-verify loop.

Builds ``--samples`` (default 540) samples from the MATH-500 reference solutions, 8 per problem, in the
mix a real run produces: correct boxed answers (exact stage), wrong boxed answers, long wrong texts,
texts whose answer is not boxed and truncated texts (math-verify stage). Each repeat times the plain
loop (exact stage, then math-verify's ``verify(parse(gold), parse(text))``, in a fresh process started
like a pool worker and warmed up the same way) and a fresh pool per worker count on the same samples, the
order alternating between repeats (the whole set grades in about 2 s, so drift matters), so every ratio is
paired in one run; the pool's start-up (paid once per eval run) is reported apart. A separate check sends ``--pathological`` 200 KB nested
``\\boxed{\\frac…}`` answers that must each end as a timeout. Prints a table, writes
``<out>/bench_grading.json`` (default ``runs/bench`` under the working directory).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from eval.benchmarks import load_source
from eval.grading import PRELOAD, Grader, check_grading_settings, exact_match, last_boxed
from zoomr.paths import output_dir

KINDS = ["correct", "correct", "correct", "unboxed", "wrong", "long_wrong", "truncated", "wrong"]


def _replace_last_boxed(text: str, new: str) -> str:
    pos = text.rfind("\\boxed")
    old = last_boxed(text)
    if pos < 0 or old is None:
        return text + f" \\boxed{{{new}}}"
    end = text.find("{", pos) + len(old) + 2
    return text[:pos] + f"\\boxed{{{new}}}" + text[end:]


def build_samples(n: int, n_pathological: int) -> list[tuple[str, str, str, str]]:
    """(kind, text, gold) triples (math: the grader's math stages)."""
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
        out.append((kind, text, p.answer))
    return out


def plain_loop(samples: list[tuple[str, str, str, str]], inner_timeout: int) -> tuple[float, float, list[bool]]:
    """The reference: one process, no workers, no caches: the same exact stage, then math-verify's
    ``verify(parse(gold), parse(text))`` in a loop (its own signal timeouts only; sympy cache cleared).
    Wall seconds, CPU seconds, correctness per sample."""
    import sympy
    from math_verify import parse, verify

    sympy.core.cache.clear_cache()
    c0, t0 = time.process_time(), time.perf_counter()
    correct = []
    for _, text, gold in samples:
        _, ok = exact_match(text, gold)
        if not ok:
            g = parse(f"\\boxed{{{gold}}}", parsing_timeout=inner_timeout) or parse(f"${gold}$", parsing_timeout=inner_timeout)
            p = parse(text, parsing_timeout=inner_timeout)
            ok = bool(g and p and verify(g, p, timeout_seconds=inner_timeout))
        correct.append(ok)
    return time.perf_counter() - t0, time.process_time() - c0, correct


def _plain_fresh(samples, warmup, inner_timeout: int) -> tuple[float, float, list[bool]]:
    plain_loop(warmup, inner_timeout)
    return plain_loop(samples, inner_timeout)


def plain_run(samples, warmup, inner_timeout: int, start_method: str) -> tuple[float, float, list[bool]]:
    """:func:`plain_loop` in a fresh process started like a pool worker (same preloaded modules, same
    warm-up), so neither side profits from having parsed these texts before (math-verify's parser keeps
    global caches across calls)."""
    import multiprocessing as mp

    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    with ctx.Pool(1) as pool:
        return pool.apply(_plain_fresh, (samples, warmup, inner_timeout))


def _cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of processes (Linux ``/proc``; 0 where unreadable)."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass
    return total


def pool_run(samples, workers: int, timeout: float, start_method: str, warmup) -> dict:
    """The pool on the same samples: started and warmed up first (the cost paid once per eval run is
    reported as ``startup_s``), then timed on ``samples``."""
    t0 = time.perf_counter()
    with Grader(workers, timeout, start_method) as grader:
        grader.start()
        grader.grade([s[1:] for s in warmup])
        startup = time.perf_counter() - t0
        before = grader.counts()
        pids = [w.proc.pid for w in grader._workers]
        cpu0, t1 = _cpu_s(pids) + time.process_time(), time.perf_counter()
        grades = grader.grade([s[1:] for s in samples])
        seconds = time.perf_counter() - t1
        cpu = _cpu_s(pids) + time.process_time() - cpu0
        counts = {k: v - before[k] for k, v in grader.counts().items()}
    return {"seconds": seconds, "cpu_s": cpu, "startup_s": startup, "grades": grades, "counts": counts}


def timeout_check(n: int, timeout: float, start_method: str) -> dict:
    """``n`` 200 KB nested answers through a 1-worker pool: each must end (graded, or killed at its
    deadline as a ``timeout``) within its limit plus a worker restart."""
    samples = build_samples(n, n)
    t0 = time.perf_counter()
    with Grader(1, timeout, start_method) as grader:
        grader.start()
        t1 = time.perf_counter()
        grades = grader.grade([s[1:] for s in samples])
        seconds = time.perf_counter() - t1
    return {
        "samples": n,
        "timeouts": sum(g.method == "timeout" for g in grades),
        "max_sample_s": round(max(g.seconds for g in grades), 2),
        "correct": sum(g.correct for g in grades),
        "seconds": round(seconds, 2),
        "bound_s": round(n * (timeout + 1.0), 1),  # each sample: its limit plus a worker restart
        "startup_s": round(t1 - t0, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.bench_grading", description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=540)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=9,
                    help="paired plain/pool measurements (order alternating); min and median")
    ap.add_argument("--pathological", type=int, default=3, help="200 KB nested answers for the timeout check")
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--start-method", default="forkserver")
    ap.add_argument("--out", type=output_dir, default="runs/bench", help="directory for bench_grading.json")
    args = ap.parse_args(argv)
    if args.samples < 1 or args.repeats < 1 or args.pathological < 0:
        ap.error("--samples and --repeats must be >= 1, --pathological >= 0")
    try:  # a worker count, timeout or start method the pool refuses was its ValueError traceback
        for workers in args.workers:
            check_grading_settings(workers, args.timeout, args.start_method)
    except ValueError as e:
        ap.error(str(e).replace("grading.workers", "--workers").replace("grading.timeout_s", "--timeout")
                 .replace("grading.start_method", "--start-method"))
    samples = build_samples(args.samples, 0)
    warmup = build_samples(8 * max(args.workers), 0)[::-1]
    inner = max(1, int(args.timeout / 3))
    load0 = os.getloadavg()[0]
    plain_s: list[float] = []
    plain_cpu: list[float] = []
    pool: dict[int, list[dict]] = {w: [] for w in args.workers}
    reference = None
    for repeat in tqdm(range(args.repeats), desc="bench grading", unit="repeat"):
        # alternate the order (plain first, then pools first) so drift in the machine's speed cancels
        order = ["plain", *args.workers] if repeat % 2 == 0 else [*args.workers, "plain"]
        for arm in order:
            if arm == "plain":
                seconds, cpu, reference = plain_run(samples, warmup, inner, args.start_method)
                plain_s.append(seconds)
                plain_cpu.append(cpu)
            else:
                pool[arm].append(pool_run(samples, arm, args.timeout, args.start_method, warmup))
    rows = []
    for w, runs in pool.items():
        ratios = [p / r["seconds"] for p, r in zip(plain_s, runs)]
        agree = sum(g.correct == ok for g, ok in zip(runs[-1]["grades"], reference))
        rows.append({
            "workers": w,
            "plain_s_median": round(statistics.median(plain_s), 3),
            "pool_s_median": round(statistics.median(r["seconds"] for r in runs), 3),
            "speedup_min": round(min(ratios), 3),
            "speedup_median": round(statistics.median(ratios), 3),
            # CPU seconds of the plain loop / of the pool (parent + workers): < 1 is the pool's overhead,
            # independent of how loaded the machine is
            "cpu_ratio_median": round(statistics.median(c / r["cpu_s"] for c, r in zip(plain_cpu, runs) if r["cpu_s"]), 3)
            if any(r["cpu_s"] for r in runs) else None,
            "startup_s_median": round(statistics.median(r["startup_s"] for r in runs), 2),
            "samples_per_second": round(len(samples) / statistics.median(r["seconds"] for r in runs), 1),
            "agree_with_plain": agree,
            # worker-side seconds / (pool seconds x workers): how much of the pool's time its workers graded
            "worker_busy_share": round(statistics.median(
                sum(g.seconds for g in r["grades"] if g.method != "exact") / (r["seconds"] * w) for r in runs), 3),
            "counts": runs[-1]["counts"],
            "methods": dict(Counter(g.method for g in runs[-1]["grades"])),
        })  # fmt: skip
    timeouts = timeout_check(args.pathological, min(args.timeout, 3.0), args.start_method) if args.pathological else None
    machine = {
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "loadavg_1min_before": round(load0, 2),
        "loadavg_1min_after": round(os.getloadavg()[0], 2),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "-"),
    }
    print(f"\ngrading {len(samples)} MATH-500-style samples ({dict(Counter(k for k, *_ in samples))}), "
          f"{args.repeats} paired repeats, {args.start_method} workers, timeout {args.timeout}s")
    print(f"machine: {machine}")
    print("| workers | plain loop s | pool s | speedup min | speedup median | CPU plain/pool | pool startup s "
          "| workers busy | agree |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workers']} | {r['plain_s_median']} | {r['pool_s_median']} | {r['speedup_min']} | "
              f"{r['speedup_median']} | {r['cpu_ratio_median']} | {r['startup_s_median']} | {r['worker_busy_share']} | "
              f"{r['agree_with_plain']}/{len(samples)} |")
    if timeouts:
        print(f"timeouts: {timeouts['samples']} 200 KB answers done in {timeouts['seconds']} s (bound "
              f"{timeouts['bound_s']} s; slowest {timeouts['max_sample_s']} s; {timeouts['timeouts']} killed "
              f"at the deadline, {timeouts['correct']} correct)")  # fmt: skip
    out = Path(args.out) / "bench_grading.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"samples": len(samples), "timeout_s": args.timeout, "repeats": args.repeats,
                               "machine": machine, "rows": rows, "timeout_check": timeouts}, indent=2))  # fmt: skip
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    from zoomr.script import run_script

    run_script(main)
