"""pass@k against its closed form, avg@k and KV aggregation, and the paired bootstrap against scipy."""

from __future__ import annotations

import itertools
from math import comb

import numpy as np
import pytest
import scipy.stats

from eval.bootstrap import index_matrix, paired_bootstrap, stratified_paired_bootstrap
from eval.metrics import compute_metrics, pass_at_k, summarize


def test_pass_at_k_closed_form():
    for n in range(1, 11):
        for c, k in itertools.product(range(n + 1), range(1, n + 1)):
            assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12), (n, c, k)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


def test_pass_at_k_is_the_probability_that_a_k_subset_has_a_correct_sample():
    outcomes = [1, 0, 0, 1, 0, 0]
    for k in range(1, 7):
        subsets = list(itertools.combinations(outcomes, k))
        assert pass_at_k(6, 2, k) == pytest.approx(np.mean([any(s) for s in subsets]))


def _row(pid, sample, correct, competition="a", truncated=False, n_tokens=10, kv=None):
    return {
        "problem_id": pid, "sample": sample, "correct": correct, "competition": competition,
        "truncated": truncated, "n_tokens": n_tokens, "kv": kv or {}, "grade_method": "exact",
    }  # fmt: skip


def test_summary_avg_pass_truncation_kv():
    rows = [
        _row("p1", 0, True, kv={"rows_mean": 10, "rows_peak": 20, "kv_per_512": 512}),
        _row(
            "p1",
            1,
            False,
            truncated=True,
            n_tokens=30,
            kv={"rows_mean": 30, "rows_peak": 60, "kv_per_512": 128},
        ),
        _row("p2", 0, False, "b"),
        _row("p2", 1, False, "b"),
    ]
    m = summarize(rows)
    assert m["avg@2"] == m["accuracy"] == pytest.approx(0.25)
    assert m["pass@1"] == pytest.approx(0.25) and m["pass@2"] == pytest.approx(0.5)
    assert m["truncation_rate"] == pytest.approx(0.25) and m["mean_tokens"] == pytest.approx(15)
    assert m["rows_mean"] == pytest.approx(20) and m["rows_peak_mean"] == pytest.approx(40)
    assert m["rows_peak_max"] == pytest.approx(60) and m["kv_per_512"] == pytest.approx(320)
    by = compute_metrics(rows)["by_competition"]
    assert by["a"]["accuracy"] == 0.5 and by["b"]["accuracy"] == 0.0


@pytest.mark.parametrize("n,seed", [(30, 0), (446, 1234), (7, 99)])
def test_paired_bootstrap_equals_scipy(n, seed):
    data = np.random.default_rng(n)
    a = data.integers(0, 9, n) / 8  # per-problem avg@8 values, with ties
    b = data.integers(0, 9, n) / 8
    ours = paired_bootstrap(a, b, n_resamples=2000, seed=seed)
    ref = scipy.stats.bootstrap(
        (a, b),
        lambda x, y, axis: np.mean(x - y, axis=axis),
        paired=True,
        method="percentile",
        n_resamples=2000,
        rng=np.random.default_rng(seed),
    )
    assert ours.low == ref.confidence_interval.low
    assert ours.high == ref.confidence_interval.high
    assert ours.delta == pytest.approx(np.mean(a - b))


def test_shared_index_matrix_is_reused_across_arms():
    rng = np.random.default_rng(0)
    ref, arm1, arm2 = (rng.random(50) for _ in range(3))
    idx = index_matrix(50, 2000, 1234)
    assert idx.shape == (2000, 50)
    assert paired_bootstrap(arm1, ref, idx) == paired_bootstrap(arm1, ref, seed=1234)
    assert paired_bootstrap(arm2, ref, idx) == paired_bootstrap(arm2, ref, seed=1234)
    same = paired_bootstrap(ref, ref, idx)
    assert same.delta == same.low == same.high == 0.0
    with pytest.raises(ValueError):
        paired_bootstrap(arm1[:10], ref, idx)


def test_stratified_bootstrap_of_one_stratum_is_the_paired_bootstrap():
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 2, 200).astype(float), rng.integers(0, 2, 200).astype(float)
    assert stratified_paired_bootstrap([(a, b)], seed=7) == paired_bootstrap(a, b, seed=7)


def test_stratified_bootstrap_resamples_within_strata():
    # a constant difference inside each stratum: every within-stratum resample has the same pooled mean, so the
    # interval collapses onto the problem-weighted mean (a bootstrap pooling the problems would spread it)
    strata = [(np.ones(30), np.zeros(30)), (np.zeros(90), np.zeros(90))]
    ci = stratified_paired_bootstrap(strata)
    assert ci.delta == ci.low == ci.high == pytest.approx(30 / 120)
    assert ci.n_problems == 120
    pooled = paired_bootstrap(np.r_[np.ones(30), np.zeros(90)], np.zeros(120))
    assert pooled.high - pooled.low > 0.1


def test_stratified_bootstrap_narrows_with_more_strata():
    rng = np.random.default_rng(0)
    draw = lambda: (rng.integers(0, 2, 256).astype(float), rng.integers(0, 2, 256).astype(float))  # noqa: E731
    strata = [draw() for _ in range(4)]
    one = stratified_paired_bootstrap(strata[:1])
    four = stratified_paired_bootstrap(strata)
    assert 1.6 < (one.high - one.low) / (four.high - four.low) < 2.4  # ~ sqrt(4)
    assert four.delta == pytest.approx(np.mean([np.mean(a - b) for a, b in strata]))
    with pytest.raises(ValueError, match="stratum 1"):
        stratified_paired_bootstrap([strata[0], (np.ones(3), np.ones(4))])
    with pytest.raises(ValueError, match="at least one"):
        stratified_paired_bootstrap([])


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"n_resamples": 0}, "n_resamples=0"),
        ({"n_resamples": -3}, "n_resamples=-3"),
        ({"confidence": 1.5}, "confidence=1.5"),
        ({"confidence": 0.0}, "confidence=0.0"),
        ({"confidence": float("nan")}, "confidence=nan"),
        ({"seed": -1}, "seed=-1"),  # the stratified bootstrap: numpy's "expected non-negative integer"
        ({"seed": 1.5}, "seed=1.5"),  # and SeedSequence's TypeError
    ],
)
def test_bootstrap_refuses_settings_that_would_print_nan(kwargs, match):
    a, b = np.ones(10), np.zeros(10)
    with pytest.raises(ValueError, match=match):
        paired_bootstrap(a, b, **kwargs)
    with pytest.raises(ValueError, match=match):
        stratified_paired_bootstrap([(a, b)], **kwargs)


def test_bench_bootstrap_refuses_sizes_it_cannot_time(tmp_path, capsys):
    from eval.bench_bootstrap import main as bench_main

    with pytest.raises(SystemExit):
        bench_main(["--resamples", "0", "--problems", "1", "--out", str(tmp_path / "b.json")])  # was a ValueError traceback
    assert "--problems, --resamples too small" in capsys.readouterr().err and not (tmp_path / "b.json").exists()
    with pytest.raises(SystemExit):
        bench_main(["--seed", "-1", "--out", str(tmp_path / "b.json")])  # was numpy's ValueError traceback
    assert "--seed -1: the resampling seed must be an integer >= 0" in capsys.readouterr().err
    assert not (tmp_path / "b.json").exists()


def test_kv_field_recorded_by_some_samples_is_left_out_not_averaged_over_them():
    """A run resumed across a version that added a kv field (``kv_per_512_all``, ``compression``): its mean was
    over the newer rows alone, reported as the run's; now it is left out and named (metrics.json, console)."""
    from eval.summary import console_table

    old = {"rows_mean": 100.0, "rows_peak": 200.0, "kv_per_512": 512.0}
    rows = [_row("p1", 0, True, kv=old), _row("p2", 0, True, kv={**old, "kv_per_512_all": 100.0}), _row("p3", 0, True)]
    m = compute_metrics(rows)
    pooled = m["pooled"]
    assert "kv_per_512_all" not in pooled and pooled["kv_per_512"] == 512.0 and pooled["rows_peak_max"] == 200.0
    assert pooled["kv_incomplete"] == {"samples_with_kv": 2, "recorded_by": {"kv_per_512_all": 1}}
    assert "recorded kv_per_512_all (1)" in console_table(m)
    assert "kv_incomplete" not in summarize([_row("p1", 0, True, kv=old), _row("p3", 0, True)])


def test_console_table_with_unequal_samples_shows_pass_at_the_fewest_not_nan():
    """Rows with 3 samples of one problem and 4 of another (``samples_per_problem`` "3-4"): the table's pass@ column
    looked up ``pass@3-4``, which no metric has, and printed nan for every line; now pass@3 (every problem has 3),
    and "—" for a competition whose own fewest samples (4) give no pass@3."""
    from eval.summary import console_table

    rows = [_row("a1", s, s == 0, "A") for s in range(3)] + [_row("b1", s, s < 2, "B") for s in range(4)]
    table = console_table(compute_metrics(rows))
    assert "nan" not in table and "pass@3" in table
    lines = {line.split()[0]: line.split() for line in table.splitlines() if line.split()}
    assert lines["A"][3] == f"{100 * pass_at_k(3, 1, 3):.1f}" and lines["B"][3] == "—"
    pooled = (pass_at_k(3, 1, 3) + pass_at_k(4, 2, 3)) / 2
    assert lines["pooled"][2:4] == [f"{100 * (1 / 3 + 1 / 2) / 2:.1f}", f"{100 * pooled:.1f}"]


def test_a_scored_tasks_console_says_its_avg_at_k_counts_full_scores():
    """RULER's console showed "avg@1 50.0" under its subset table's mean score 75.00 with no word that avg@k counts
    only the samples scoring 1 (``correct`` of a scored task)."""
    from eval.summary import console_table
    from eval.tasks import get_task

    task = get_task("ruler")
    rows = [{**_row(f"niah_single_1-{i}", 0, s >= 1.0, "niah_single_1"), "score": s} for i, s in enumerate([1.0, 0.5])]
    metrics = {**compute_metrics(rows), **task.metrics(rows)}
    text = task.report(metrics, console_table(metrics))
    assert metrics["pooled"]["accuracy"] == 0.5 and metrics["ruler"]["average"] == 75.0
    assert "ruler: avg@k and pass@k count the samples with a full score (score 1)" in text
