"""The testbed pipeline end to end on a few steps: the trainer saves a loadable checkpoint with its data
config; the results table decodes every arm, respects the budgets and reuses finished arms."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import testbed_table
from zoomr.testbed import checkpoint as testbed_arms
from zoomr.testbed.grading import load_test_problems


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("tb_train")
    cmd = [
        sys.executable, "-m", "train", "+method=sft_testbed", "data=testbed_summaries", "model=tiny-testbed",
        "data.trace_tokens=160", "method.max_steps=4", "method.curriculum.copy_steps=0", "method.curriculum.recall_steps=1",
        "method.tokens_per_step=512", "method.curriculum.copy_tokens_per_step=256", "method.eval_every=2",
        "method.eval_examples=2", "method.save_every=2", "logger=none", f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["resumed_from"] == "-"
    assert len(json.loads((run_dir / "eval_history.json").read_text())) == 2
    return run_dir / "final"


def test_checkpoint_carries_its_data_config(checkpoint):
    saved = json.loads((checkpoint / testbed_arms.DATA_FILE).read_text())
    assert saved["summaries"] is True and saved["trace_tokens"] == 160
    data = testbed_arms.trained_data(checkpoint, trace_tokens=128, summaries=None)  # None: keep the trained value
    assert data.trace_tokens == 128 and data.summaries is True


def test_table_arms_budgets_and_resume(checkpoint, tmp_path):
    argv = ["--model", str(checkpoint), "--n", "3", "--batch", "2", "--fractions", "0.5", "--out", str(tmp_path)]
    results = testbed_table.main(argv)
    (name,) = results
    arms = results[name]
    assert set(arms) == {"full", "streaming@0.5", "h2o@0.5", "_meta"}
    rows = testbed_arms.full_rows(load_test_problems(testbed_arms.trained_data(checkpoint), 3))
    budget = round(0.5 * rows)
    assert arms["streaming@0.5"]["policy"]["budget_rows"] == budget == arms["h2o@0.5"]["policy"]["budget_rows"]
    assert arms["full"]["rows_ratio"] == 1.0
    for arm in ("streaming@0.5", "h2o@0.5"):
        assert arms[arm]["rows_mean"] < arms["full"]["rows_mean"]
        assert arms[arm]["problems"] == 3 and len(arms[arm]["correct"]) == 3
    assert (tmp_path / "table.md").read_text().count("|") > 20 and (tmp_path / "recall_by_distance.png").exists()
    # a rerun reuses every finished arm (the saved files are not rewritten)
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "arms").glob("*.json")}
    assert len(stamps) == 3
    testbed_table.main(argv)
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "arms").glob("*.json")} == stamps


def test_zoomr_arms_through_the_evaluator_keep_the_recompute_log(checkpoint, tmp_path, capsys):
    """``analysis.zoomr_testbed``: ZoomR's per-cue selection comes from the recompute log its cache kept,
    read by the evaluator's inspect hook into the rows; a rerun reuses the finished arms. Each arm's console line
    gives its numbers at 4 significant digits (they were printed whole: 'recall': 0.1253968253968254)."""
    from analysis import zoomr_testbed
    from eval.results import RESULTS_FILE

    argv = ["--model", str(checkpoint), "--n", "2", "--batch", "2", "--arms", "full", "zoomr", "--out", str(tmp_path)]
    results = zoomr_testbed.main(argv)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("full {", "zoomr {"))]
    assert len(lines) == 2 and "'hit_rate': " in lines[1]
    assert all(float(x) == float(f"{float(x):.4g}") for x in re.findall(r"\d+\.\d+(?:e-?\d+)?", "".join(lines)))
    records = load_test_problems(testbed_arms.trained_data(checkpoint), 2)
    sel = results["zoomr"]["selection"]
    assert sel["cues"] == sum(len(r["queries"]) for r in records) and 0.0 <= sel["hit_rate"] <= 1.0
    (run_dir,) = [p for p in (tmp_path / "arms").iterdir() if p.is_dir() and p.name.startswith("zoomr-")]
    rows = [json.loads(line) for line in (run_dir / RESULTS_FILE).read_text().splitlines()]
    assert len(rows) == 2 and all(r["decode"]["recomputes"] for r in rows)
    assert len(results["zoomr"]["rows_vs_length"]["zoomr_rows"]) > 0 and results["full"]["rows_over_full"] == 1.0
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "arms").glob("*.json")}
    zoomr_testbed.main(argv)
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "arms").glob("*.json")} == stamps


def test_pointer_stage_continues_from_the_checkpoint(checkpoint, tmp_path):
    """``method.init_from`` starts from the checkpoint's weights (not a fresh init) and the key-token pointer
    loss (with the value-read device on) trains; the stage's final weights differ from its start."""
    from safetensors.torch import load_file

    run_dir = tmp_path / "stage"
    cmd = [
        sys.executable, "-m", "train", "+method=sft_testbed", "data=testbed_summaries", "model=tiny-testbed",
        "data.trace_tokens=160", f"method.init_from={checkpoint}", "method.summary_pointer_at_key=true",
        "method.max_steps=2", "method.curriculum.copy_steps=0", "method.curriculum.recall_steps=0",
        "method.curriculum.start_tokens=160", "method.tokens_per_step=512", "method.eval_every=2",
        "method.eval_examples=2", "method.warmup_steps=1", "method.value_read_weight=1.0", "logger=none",
        f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    start, end = load_file(checkpoint / "model.safetensors"), load_file(run_dir / "final" / "model.safetensors")
    # a fresh init would be far from the start everywhere; two small steps stay close but move
    diffs = [float((end[k] - start[k]).abs().max()) for k in start]
    assert max(diffs) > 0 and max(diffs) < 0.05, (min(diffs), max(diffs))
    bad = [("data=testbed" if a == "data=testbed_summaries" else a) for a in cmd[:-1]] + [f"hydra.run.dir={tmp_path / 'bad'}"]
    proc = subprocess.run(bad, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "summary_pointer_at_key" in proc.stderr
    assert not (tmp_path / "bad" / "summary.json").exists()


def test_bf16_autocast_trains_in_bfloat16_and_keeps_float32_weights(checkpoint, tmp_path):
    """``method.autocast_bf16`` (a variant): the same two steps from the same weights under bf16 autocast end at
    other weights than in float32 (the forward ran in bfloat16), saved as float32, after an AdamW update of the same
    size (Adam normalises it: about the learning rate per step either way)."""
    from safetensors.torch import load_file

    finals = {}
    for bf16 in (False, True):
        run_dir = tmp_path / f"bf16_{bf16}"
        cmd = [
            sys.executable, "-m", "train", "+method=sft_testbed", "data=testbed_summaries", "model=tiny-testbed",
            "data.trace_tokens=160", f"method.init_from={checkpoint}", "method.max_steps=2",
            "method.curriculum.copy_steps=0", "method.curriculum.recall_steps=0", "method.curriculum.start_tokens=160",
            "method.tokens_per_step=512", "method.eval_every=2", "method.eval_examples=2", "method.warmup_steps=1",
            f"method.autocast_bf16={str(bf16).lower()}", "logger=none", f"hydra.run.dir={run_dir}",
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        finals[bf16] = load_file(run_dir / "final" / "model.safetensors")
    start = load_file(checkpoint / "model.safetensors")
    assert all(t.dtype == start[k].dtype for k, t in finals[True].items())
    gap = max(float((finals[True][k] - finals[False][k]).abs().max()) for k in start)
    step = {bf16: max(float((w[k] - start[k]).abs().max()) for k in start) for bf16, w in finals.items()}
    assert gap > 0 and 0.5 < step[True] / step[False] < 2, (gap, step)
