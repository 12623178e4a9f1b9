"""``python -m eval.bench_bootstrap``: time of the paired bootstrap at paper scale (2,000 x 446 problems).

Times the shared index matrix, one paired interval, a comparison of ``--arms`` arms against one
reference sharing the matrix, and ``scipy.stats.bootstrap`` on the same data (checking equality).
Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import scipy.stats

from eval.bootstrap import check_bootstrap_settings, index_matrix, paired_bootstrap
from zoomr.paths import output_file


def _best(fn, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.bench_bootstrap", description=__doc__.split("\n\n")[0])
    ap.add_argument("--problems", type=int, default=446)
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--arms", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", type=output_file, default="runs/bench/bootstrap.json")
    args = ap.parse_args(argv)
    floors = {"problems": 2, "resamples": 1, "arms": 1, "repeats": 1}
    low = [f"--{k}" for k, floor in floors.items() if getattr(args, k) < floor]
    if low:
        ap.error(f"{', '.join(low)} too small: --problems must be >= 2, the others >= 1")
    try:
        check_bootstrap_settings(args.resamples, seed=args.seed)
    except ValueError as e:  # --seed -1 was numpy's ValueError traceback
        ap.error(str(e).replace("seed=", "--seed "))
    data = np.random.default_rng(0)
    ref = data.integers(0, 9, args.problems) / 8
    arms = [data.integers(0, 9, args.problems) / 8 for _ in range(args.arms)]
    n, r = args.problems, args.resamples

    t_idx, idx = _best(lambda: index_matrix(n, r, args.seed), args.repeats)
    t_one, ci = _best(lambda: paired_bootstrap(arms[0], ref, idx), args.repeats)
    t_all, _ = _best(lambda: [paired_bootstrap(a, ref, index_matrix(n, r, args.seed)) for a in arms[:1]]
                     + [paired_bootstrap(a, ref, idx) for a in arms[1:]], args.repeats)  # fmt: skip
    t_scipy, res = _best(
        lambda: scipy.stats.bootstrap(
            (arms[0], ref), lambda x, y, axis: np.mean(x - y, axis=axis), paired=True, method="percentile",
            n_resamples=r, rng=np.random.default_rng(args.seed),
        ),
        args.repeats,
    )  # fmt: skip
    equal = (ci.low, ci.high) == (res.confidence_interval.low, res.confidence_interval.high)
    rows = [
        ("index matrix", t_idx),
        ("one paired interval (shared matrix)", t_one),
        (f"{args.arms} arms vs reference (matrix built once)", t_all),
        ("scipy.stats.bootstrap, one arm", t_scipy),
    ]
    print(f"paired bootstrap: {r} resamples x {n} problems, best of {args.repeats}")
    print("| step | milliseconds |\n|---|---|")
    for name, t in rows:
        print(f"| {name} | {1000 * t:.1f} |")
    print(f"interval identical to scipy: {equal} ({ci.low:+.4f}, {ci.high:+.4f})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"problems": n, "resamples": r, "arms": args.arms, "equal_to_scipy": equal,
                               "milliseconds": {name: round(1000 * t, 2) for name, t in rows}}, indent=2))  # fmt: skip
    print(f"written: {out}")
    return 0 if equal else 1


if __name__ == "__main__":
    from zoomr.script import run_script

    run_script(main)
