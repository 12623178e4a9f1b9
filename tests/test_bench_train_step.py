"""The training-step benchmark: every mode steps a copy of the same weights on the same batch, ratios are against
eager fp32 in the same process, and the JSON lands under the working directory."""

from __future__ import annotations

import json

import pytest

SMALL = ["--batch", "2", "--seq", "48", "--warmup", "0", "--steps", "2", "--threads", "1"]


def test_modes_start_from_the_same_weights_and_report_against_eager(tmp_path, monkeypatch, cache_dir):
    from analysis.bench_train_step import main

    monkeypatch.chdir(tmp_path)
    report = main([*SMALL, "--modes", "eager", "bf16", "--cache-dir", cache_dir])
    eager, bf16 = report["results"]
    assert eager["step_ratio_vs_eager"] == 1.0
    assert bf16["step_ratio_vs_eager"] == pytest.approx(eager["step_median_s"] / bf16["step_median_s"])
    assert eager["tokens_per_s"] == pytest.approx(2 * 48 / eager["step_median_s"])
    # the same initial weights and batch: the first loss differs only by bf16 rounding (a copy, not a trained model)
    assert abs(bf16["first_loss"] - eager["first_loss"]) < 0.05 and eager["first_loss"] > 1.0
    assert len(eager["step_s"]) == 2 and report["params"] > 0
    (written,) = (tmp_path / "runs" / "bench_train_step").glob("bench-tiny-testbed-*.json")
    assert json.loads(written.read_text())["results"][1]["mode"] == "bf16"


def test_impossible_sizes_are_refused_before_any_model_loads(tmp_path, monkeypatch, capsys):
    from analysis.bench_train_step import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["--seq", "0", "--steps", "0"])
    assert "--seq, --steps must be >= 1" in capsys.readouterr().err and not (tmp_path / "runs").exists()
    with pytest.raises(SystemExit):
        main(["--model", "bogus"])  # a FileNotFoundError traceback
    assert "--model bogus: no conf/model/bogus.yaml" in capsys.readouterr().err and not (tmp_path / "runs").exists()


@pytest.mark.slow  # inductor compiles the forward and backward (~10-30 s)
def test_compiled_step_computes_the_eager_loss(cache_dir, tmp_path):
    from analysis.bench_train_step import main

    report = main([*SMALL, "--modes", "eager", "compile", "--cache-dir", cache_dir, "--out", str(tmp_path / "b.json")])
    eager, compiled = report["results"]
    assert compiled["first_loss"] == pytest.approx(eager["first_loss"], abs=1e-4)
