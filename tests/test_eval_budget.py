"""Budgets relative to the run (``method.budget_fraction`` / ``method.budget_match``) and the run that says when
its policy never evicted (issue 19.1: at the tiny defaults budget_rows=1024 exceeds every sequence)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from eval.__main__ import run
from eval.budget import resolve_budget
from eval.summary import console_table, eviction_report
from zoomr.cache import build_policy, match_budget
from zoomr.cache.h2o import H2OConfig
from zoomr.cache.streaming import StreamingConfig
from zoomr.entry import CONF_DIR
from zoomr.schemas import register_with_hydra

register_with_hydra()
SMALL = ["benchmark=aime25", "benchmark.problem_limit=2", "generation.n_samples=1", "generation.max_new_tokens=32",
         "generation.batch_size=2", "grading.workers=1", "logger=none"]  # fmt: skip


def _cfg(run_dir: Path, *overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("eval", overrides=[*SMALL, *overrides, f"run_dir={run_dir}"])


def _row(prompt: int, n: int, final: float) -> dict:
    return {"prompt_tokens": prompt, "n_tokens": n, "kv": {"rows_final": final, "rows_peak": final}}


def _finished(run_dir: Path, policy: str | None, rows_mean: float, rows_peak_mean: float) -> Path:
    run_dir.mkdir(parents=True)
    method = None if policy is None else {"name": policy, "policy": policy}
    config = {"benchmark": {"name": "aime25"}, "model": {"name": "tiny-qwen2"}, "method": method}
    (run_dir / "config.json").write_text(json.dumps(config))
    pooled = {"rows_mean": rows_mean, "rows_peak_mean": rows_peak_mean}
    (run_dir / "metrics.json").write_text(json.dumps({"pooled": pooled}))
    return run_dir


def test_eviction_report_names_a_policy_that_never_evicted():
    whole = [_row(100, 49, 148.0), _row(90, 20, 109.0)]  # prompt + n - 1 rows: exactly full KV
    streaming = {"name": "streaming", "policy": "streaming", "budget_rows": 1024}
    report = eviction_report(whole, streaming)
    assert report["evicted_samples"] == 0 and "never evicted" in report["note"]
    assert "budget_rows=1024" in report["note"] and "method.budget_fraction" in report["note"]
    assert "note" not in eviction_report(whole, None)  # full KV keeps everything by design
    assert "note" not in eviction_report([*whole, _row(100, 49, 64.0)], streaming)
    assert "own rule" in eviction_report(whole, {"name": "kvzap", "policy": "kvzap"})["note"]
    table = console_table({"pooled": {"problems": 2, "accuracy": 0.5, "truncation_rate": 0.0, "mean_tokens": 30,
                                      "rows_mean": 80.0, "rows_peak_max": 148.0, "kv_per_512": 512.0,
                                      "kv_per_512_all": 512.0, "samples_per_problem": 1, "pass@1": 0.5},
                           "by_competition": {"a": {}}, "eviction": report})  # fmt: skip
    assert "KV/512" in table and " 512 " in table and "NOTE: policy 'streaming' never evicted" in table


def test_resolve_fraction_and_match(tmp_path):
    _finished(tmp_path / "full", None, rows_mean=120.0, rows_peak_mean=180.0)
    _finished(tmp_path / "zoomr", "zoomr", rows_mean=61.4, rows_peak_mean=90.0)
    cfg = _cfg(tmp_path / "h2o", "+method=h2o", "method.budget_fraction=0.25")
    note = resolve_budget(cfg)
    assert cfg.method.budget_rows == 45 and cfg.method.budget_fraction is None and "0.25 x full KV" in note
    cfg = _cfg(tmp_path / "rkv", "+method=rkv", f"method.budget_match={tmp_path / 'zoomr'}")
    resolve_budget(cfg)
    assert cfg.method.budget_rows == 61 and cfg.method.budget_match is None
    assert resolve_budget(_cfg(tmp_path / "x", "+method=streaming")) is None  # a plain budget stays
    assert _cfg(tmp_path / "x", "+method=streaming").method.budget_rows == 1024


def test_relative_budget_errors_say_what_to_do(tmp_path):
    with pytest.raises(SystemExit, match="run full KV first"):
        resolve_budget(_cfg(tmp_path / "h2o", "+method=h2o", "method.budget_fraction=0.5"))
    _finished(tmp_path / "snap", "snapkv", 50.0, 60.0)
    with pytest.raises(SystemExit, match="not full KV"):
        resolve_budget(_cfg(tmp_path / "h2o", "+method=h2o", "method.budget_fraction=0.5",
                            f"method.budget_reference={tmp_path / 'snap'}"))  # fmt: skip
    with pytest.raises(ValueError, match="no row budget"):  # refused by the policy's config itself
        resolve_budget(_cfg(tmp_path / "e", "+method=evict_recency", f"method.budget_match={tmp_path / 'snap'}"))
    with pytest.raises(ValueError, match="budget_fraction must lie in"):
        H2OConfig(budget_fraction=1.5)
    with pytest.raises(ValueError, match="not both"):
        StreamingConfig(budget_fraction=0.5, budget_match="runs/x")
    with pytest.raises(ValueError, match="match_budget"):  # the library never silently ignores a fraction
        build_policy(H2OConfig(budget_fraction=0.5), None)
    assert match_budget(H2OConfig(budget_fraction=0.5), 33.4).budget_rows == 33
    # a reference whose metrics are torn or not an eval run's: named (were a JSONDecodeError / KeyError traceback)
    (tmp_path / "snap" / "metrics.json").write_text('{"pooled": ')
    with pytest.raises(ValueError, match="snap/metrics.json: not valid JSON"):
        resolve_budget(_cfg(tmp_path / "h2o", "+method=h2o", f"method.budget_match={tmp_path / 'snap'}"))
    (tmp_path / "snap" / "metrics.json").write_text('{"accuracy": 0.5}')
    with pytest.raises(SystemExit, match="has no pooled rows_mean / rows_peak_mean"):
        resolve_budget(_cfg(tmp_path / "h2o", "+method=h2o", f"method.budget_match={tmp_path / 'snap'}"))


def test_relative_budget_the_policy_cannot_use_is_a_settings_error(tmp_path):
    """A fraction that leaves fewer rows than SnapKV's window was a ValueError traceback from match_budget."""
    from zoomr.schemas.checks import SettingsError

    _finished(tmp_path / "full", None, rows_mean=120.0, rows_peak_mean=180.0)
    cfg = _cfg(tmp_path / "snapkv", "+method=snapkv", "method.budget_fraction=0.1")
    with pytest.raises(SettingsError, match=r"method.budget_fraction=0.1: .* is budget_rows=18, which snapkv cannot "
                                            r"use \(SnapKVConfig: need budget_rows >= window, got 18 < 32\)"):
        resolve_budget(cfg)
    assert cfg.method.budget_rows == 1024 and not (tmp_path / "snapkv").exists()


def test_tiny_run_says_it_never_evicted_then_a_fraction_does(tmp_path, cache_dir, capsys):
    """The README's baseline line at the tiny defaults: identical to full KV, and now it says so."""
    full = run(_cfg(tmp_path / "full", f"cache_dir={cache_dir}"))
    streaming = run(_cfg(tmp_path / "streaming", f"cache_dir={cache_dir}", "+method=streaming"))
    out = capsys.readouterr().out
    assert streaming["eviction"]["evicted_samples"] == 0 and "NOTE: policy 'streaming' never evicted" in out
    assert streaming["pooled"]["rows_mean"] == full["pooled"]["rows_mean"]
    assert "KV/512" in out and "rows" in out
    run(_cfg(tmp_path / "full", f"cache_dir={cache_dir}"))  # a resumed run says what it skipped
    assert "2 of 2 samples already done, skipped; 0 to run" in capsys.readouterr().out
    half = run(_cfg(tmp_path / "streaming-50", f"cache_dir={cache_dir}", "+method=streaming",
                    "method.budget_fraction=0.5"))  # fmt: skip
    config = json.loads((tmp_path / "streaming-50" / "config.json").read_text())
    assert config["method"]["budget_rows"] == round(0.5 * full["pooled"]["rows_peak_mean"])
    assert config["method"]["budget_fraction"] is None  # the fingerprint holds the resolved rows
    budget = config["method"]["budget_rows"]
    full_rows = [json.loads(line) for line in (tmp_path / "full" / "results.jsonl").read_text().splitlines()]
    longer = sum(r["kv"]["rows_peak"] > budget for r in full_rows)  # the samples that had to evict
    assert longer >= 1 and half["eviction"]["evicted_samples"] == longer and "note" not in half["eviction"]
    assert half["pooled"]["rows_peak_max"] <= budget + 1
    summary = json.loads((tmp_path / "streaming-50" / "summary.json").read_text())
    assert summary["evicted_samples"] == longer


def test_a_budget_below_one_row_is_refused_not_clamped(tmp_path):
    """``match_budget`` turned 0, -5 or 0.2 rows into ``budget_rows=1`` without a word (a fraction of a short full-KV
    run decoded at one row), and NaN / infinity / a string were a ValueError, OverflowError or TypeError traceback."""
    for rows in (0, -5, 0.2, float("nan"), float("inf"), "5", True):
        with pytest.raises(ValueError, match=rf"match_budget: rows={rows!r} is not a row budget for policy 'h2o'"):
            match_budget(H2OConfig(), rows)
    assert match_budget(H2OConfig(), 0.6).budget_rows == 1 and match_budget(H2OConfig(), 2).budget_rows == 2
    _finished(tmp_path / "full", None, rows_mean=120.0, rows_peak_mean=180.0)
    cfg = _cfg(tmp_path / "h2o", "+method=h2o", "method.budget_fraction=0.001")
    with pytest.raises(ValueError, match=r"method.budget_fraction=0.001: .* is budget_rows=0, which h2o cannot use"):
        resolve_budget(cfg)
    assert cfg.method.budget_rows == 1024 and not (tmp_path / "h2o").exists()


@pytest.mark.parametrize("pooled", ['{"rows_mean": null, "rows_peak_mean": 180.0}', '{"rows_mean": 120.0, "rows_peak_mean": NaN}'])
def test_a_reference_whose_rows_are_not_numbers_is_named(tmp_path, pooled):
    """A reference ``metrics.json`` with ``rows_mean: null`` was a TypeError traceback (``budget_fraction * None``,
    or formatting the rows of the refusal); a NaN became 'budget_rows=nan, which h2o cannot use'."""
    ref = _finished(tmp_path / "full", None, rows_mean=0.0, rows_peak_mean=0.0)
    (ref / "metrics.json").write_text('{"pooled": ' + pooled + "}")
    for arg in ("method.budget_fraction=0.5", f"method.budget_match={ref}"):
        with pytest.raises(SystemExit, match=r"full/metrics.json has pooled rows_(peak_)?mean=(None|nan), not a number"):
            resolve_budget(_cfg(tmp_path / "h2o", "+method=h2o", arg))
