"""Run metrics from result rows (METHODS.md, evaluation conventions; AbridgeKV §4).

- avg@k: mean over problems of (correct samples / samples).
- pass@k: unbiased estimator 1 - C(n-c, k) / C(n, k) per problem (Chen et al., 2021), averaged.
- truncation rate: fraction of samples that hit the generation cap; mean generated tokens.
- resident KV: every numeric field of a row's ``kv`` record (written by :mod:`eval.generation`) is
  averaged over samples; fields named ``*_peak`` are also maxed. ``kv_per_512`` is the AbridgeKV budget
  unit: persistent KV rows kept per 512 generated tokens per KV head. A field only some samples recorded is left
  out and named under ``kv_incomplete`` (:func:`kv_summary`).

Everything is computed per competition and pooled over all problems of the run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with n samples of which c are correct (numerically stable)."""
    if not 0 <= c <= n or k < 1 or k > n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def per_problem(rows: Iterable[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """problem id -> (samples, correct samples)."""
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in rows:
        c = counts[r["problem_id"]]
        c[0] += 1
        c[1] += bool(r["correct"])
    return {pid: (n, c) for pid, (n, c) in counts.items()}


def per_problem_accuracy(rows: Iterable[dict[str, Any]]) -> dict[str, float]:
    return {pid: c / n for pid, (n, c) in per_problem(rows).items()}


def _k_values(n_min: int) -> list[int]:
    ks, k = [], 1
    while k <= n_min:
        ks.append(k)
        k *= 2
    if n_min not in ks:
        ks.append(n_min)
    return ks


def kv_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean of every numeric ``kv`` field over samples; ``*_peak`` fields also as their maximum. Samples without
    KV statistics (an empty ``kv``) are not counted; a field that only some of the samples with statistics
    recorded (a run resumed across a version that added it, e.g. ``kv_per_512_all``) is left out of the means, which
    would be over those samples alone, and named in ``kv_incomplete``: ``{"samples_with_kv": N, "recorded_by":
    {field: samples that recorded it}}``."""
    values: dict[str, list[float]] = defaultdict(list)
    recorded = 0
    for r in rows:
        kv = r.get("kv") or {}
        recorded += bool(kv)
        for key, v in kv.items():
            if isinstance(v, int | float) and not isinstance(v, bool):
                values[key].append(float(v))
    out: dict[str, Any] = {}
    partial = {key: len(vs) for key, vs in sorted(values.items()) if len(vs) < recorded}
    for key, vs in sorted(values.items()):
        if key in partial:
            continue
        out[f"{key}_mean" if key.endswith("_peak") else key] = float(np.mean(vs))
        if key.endswith("_peak"):
            out[f"{key}_max"] = float(np.max(vs))
    if partial:
        out["kv_incomplete"] = {"samples_with_kv": recorded, "recorded_by": partial}
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Metrics of one set of rows (a competition or the pooled run)."""
    if not rows:
        return {"problems": 0, "samples": 0}
    counts = per_problem(rows)
    ns = [n for n, _ in counts.values()]
    k = min(ns)
    out: dict[str, Any] = {
        "problems": len(counts),
        "samples": len(rows),
        "samples_per_problem": k if min(ns) == max(ns) else f"{min(ns)}-{max(ns)}",
        "accuracy": float(np.mean([c / n for n, c in counts.values()])),
    }
    out[f"avg@{k}"] = out["accuracy"]
    for kk in _k_values(k):
        out[f"pass@{kk}"] = float(np.mean([pass_at_k(n, c, kk) for n, c in counts.values()]))
    out["truncation_rate"] = float(np.mean([bool(r["truncated"]) for r in rows]))
    out["mean_tokens"] = float(np.mean([r["n_tokens"] for r in rows]))
    out["grade_methods"] = dict(sorted(_count(r.get("grade_method", "?") for r in rows).items()))
    out.update(kv_summary(rows))
    return out


def _count(items: Iterable[str]) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for x in items:
        out[x] += 1
    return dict(out)


def compute_metrics(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"pooled": {...}, "by_competition": {name: {...}}}``."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[r["competition"]].append(r)
    return {
        "pooled": summarize(rows),
        "by_competition": {name: summarize(g) for name, g in sorted(groups.items())},
    }

