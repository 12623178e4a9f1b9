"""Paired bootstrap over problems (AbridgeKV §4 and App. B.2; METHODS.md, evaluation conventions).

Per problem, the mean correctness of arm A minus arm B; problems are resampled with replacement
(2,000 resamples) through ONE index matrix shared by every comparison, and the 95% interval is the
percentile interval of the resampled mean differences.

Identical to ``scipy.stats.bootstrap((a, b), lambda x, y, axis: np.mean(x - y, axis=axis),
paired=True, method="percentile", n_resamples=2000, rng=np.random.default_rng(seed))``: scipy draws
the paired indices as ``rng.integers(0, n, (n_resamples, n))`` (``_bootstrap_resample`` on
``arange(n)``), evaluates the statistic along the last axis and takes ``scipy.stats.quantile`` at
``alpha/2`` and ``1 - alpha/2``; this module does the same operations in the same order.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PairedCI:
    """Mean difference A - B (fractions, not points) and its percentile interval."""

    delta: float
    low: float
    high: float
    n_problems: int
    n_resamples: int


def index_matrix(n_problems: int, n_resamples: int = 2000, seed: int = 1234) -> np.ndarray:
    """The shared (n_resamples, n_problems) matrix of resampled problem indices; refused (``SettingsError``) when
    it would not fit in the memory free now (``--n-resamples 100000000`` was numpy's MemoryError traceback after
    every run had been read, or a machine swapping until the kernel killed it)."""
    from zoomr.schemas.checks import SettingsError

    if n_problems < 2:
        raise ValueError(f"the paired bootstrap needs at least 2 problems, got {n_problems}")
    check_bootstrap_settings(n_resamples, seed=seed)
    need, free = n_resamples * n_problems * np.dtype(np.int64).itemsize, free_memory_bytes()
    if free is not None and need > free:
        raise SettingsError(
            f"n_resamples={n_resamples} resamples of {n_problems} problems need {need / 2**30:.1f} GiB of indices, "
            f"more than the {free / 2**30:.1f} GiB free: use fewer resamples (2000 is usual)"
        )
    return np.random.default_rng(seed).integers(0, n_problems, (n_resamples, n_problems))


def free_memory_bytes() -> int | None:
    """Physical memory free now (Linux and most Unixes; None where the system does not say)."""
    import os

    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def paired_bootstrap(
    a: np.ndarray,
    b: np.ndarray,
    indices: np.ndarray | None = None,
    n_resamples: int = 2000,
    seed: int = 1234,
    confidence: float = 0.95,
) -> PairedCI:
    """Percentile interval of mean(a - b) over resampled problems; ``a[i]``, ``b[i]`` are problem i's
    per-problem accuracies. Pass ``indices`` (from :func:`index_matrix`) to share them across arms."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"paired samples must be 1-D of equal length, got {a.shape} and {b.shape}")
    if indices is None:
        indices = index_matrix(len(a), n_resamples, seed)
    if indices.shape[1] != len(a):
        raise ValueError(f"index matrix is for {indices.shape[1]} problems, samples have {len(a)}")
    diff = a - b
    low, high = _percentile_interval(np.mean(diff[indices], axis=-1), confidence)
    return PairedCI(float(np.mean(diff)), float(low), float(high), len(a), indices.shape[0])


def stratified_paired_bootstrap(
    strata: list[tuple[np.ndarray, np.ndarray]],
    n_resamples: int = 2000,
    seed: int = 1234,
    confidence: float = 0.95,
) -> PairedCI:
    """Paired bootstrap pooled over strata (e.g. test seeds): problems are resampled with replacement
    *within* their stratum, so every resample keeps each stratum's problem count, and the statistic is the
    mean of a - b over all problems. One stratum gives exactly :func:`paired_bootstrap` with the same seed
    (the same index draw and reduction)."""
    if not strata:
        raise ValueError("the stratified bootstrap needs at least one stratum")
    check_bootstrap_settings(n_resamples, confidence, seed)
    rng = np.random.default_rng(seed)
    sums = np.zeros(n_resamples)
    diffs = []
    for i, (a, b) in enumerate(strata):
        a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
        if a.shape != b.shape or a.ndim != 1:
            raise ValueError(f"stratum {i}: paired samples must be 1-D of equal length, got {a.shape} and {b.shape}")
        if len(a) < 2:
            raise ValueError(f"stratum {i}: the paired bootstrap needs at least 2 problems, got {len(a)}")
        diff = a - b
        sums += np.add.reduce(diff[rng.integers(0, len(diff), (n_resamples, len(diff)))], axis=-1)
        diffs.append(diff)
    n = sum(len(d) for d in diffs)
    low, high = _percentile_interval(sums / n, confidence)
    return PairedCI(float(np.mean(np.concatenate(diffs))), float(low), float(high), n, n_resamples)


def check_bootstrap_settings(n_resamples: int, confidence: float = 0.95, seed: int = 0) -> None:
    """Refuse settings that would print NaN or crash inside numpy: n_resamples >= 1, 0 < confidence < 1, and a
    seed numpy's generator takes (an integer >= 0)."""
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, numbers.Integral) or n_resamples < 1:
        raise ValueError(f"n_resamples={n_resamples!r}: the bootstrap needs at least 1 resample (2000 is usual)")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence={confidence!r}: a confidence level must lie strictly between 0 and 1 (e.g. 0.95)")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed={seed!r}: the resampling seed must be an integer >= 0")


def _percentile_interval(distribution: np.ndarray, confidence: float) -> tuple[float, float]:
    """scipy's percentile interval of a bootstrap distribution (``scipy.stats.quantile`` at α/2, 1 − α/2)."""
    from scipy.stats import quantile

    check_bootstrap_settings(len(distribution), confidence)
    alpha = np.asarray((1 - confidence) / 2, dtype=distribution.dtype)
    low, high = quantile(distribution, np.stack((alpha, 1 - alpha), axis=-1), axis=-1)
    return low, high
