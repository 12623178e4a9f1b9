"""The real entry point on a tiny model: end to end, and killed with SIGKILL mid-run then rerun, it ends
with exactly one row per (problem, sample) and the metrics of an uninterrupted run (greedy)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from eval.__main__ import run
from eval.results import RESULTS_FILE
from zoomr.entry import CONF_DIR
from zoomr.paths import REPO_ROOT
from zoomr.schemas import register_with_hydra

register_with_hydra()
N_PROBLEMS, N_SAMPLES = 6, 2
OVERRIDES = [
    "benchmark=aime25",
    f"benchmark.problem_limit={N_PROBLEMS}",
    f"generation.n_samples={N_SAMPLES}",
    "generation.temperature=0",
    "generation.max_new_tokens=48",
    "generation.batch_size=1",
    "grading.workers=1",
    "logger=none",
]


def _lines(run_dir: Path) -> list[str]:
    path = run_dir / RESULTS_FILE
    return path.read_text().splitlines() if path.exists() else []


def _metrics(run_dir: Path) -> dict:
    m = json.loads((run_dir / "metrics.json").read_text())
    m.pop("grading_timeouts_this_run")
    m.pop("grading_this_run")  # what this process graded: differs between a resumed and a whole run
    return m


def _cli(run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "eval", *OVERRIDES, f"run_dir={run_dir}"]


def _run_in_process(run_dir: Path, cache_dir: str, *overrides: str) -> dict:
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("eval", overrides=[*overrides, f"run_dir={run_dir}", f"cache_dir={cache_dir}"])
    return run(cfg)


def test_entry_point_full_kv_and_a_compressing_policy(tmp_path, cache_dir):
    small = ["benchmark=suite", "benchmark.problem_limit=2", "generation.n_samples=2", "generation.max_new_tokens=40",
             "generation.batch_size=4", "grading.workers=1", "logger=none"]  # fmt: skip
    full = _run_in_process(tmp_path / "full", cache_dir, *small)["pooled"]
    assert full["samples"] == 4 and full["kv_per_512"] == pytest.approx(512.0)
    rows = [json.loads(line) for line in _lines(tmp_path / "full")]
    for r in rows:
        assert r["kv"]["rows_final"] == r["prompt_tokens"] + r["n_tokens"] - 1  # full KV keeps every row
        assert r["truncated"] == (r["n_tokens"] == 40)
    assert json.loads((tmp_path / "full" / "summary.json").read_text())["method"] == "full"
    again = _run_in_process(tmp_path / "full", cache_dir, *small)  # resumes: nothing left to generate
    assert len(_lines(tmp_path / "full")) == 4 and again["pooled"]["accuracy"] == full["accuracy"]
    # StreamingLLM holds at most budget_rows rows per head, so its KV/512 falls well below full KV's
    stream = _run_in_process(
        tmp_path / "stream", cache_dir, *small, "+method=streaming", "method.budget_rows=16"
    )
    assert stream["pooled"]["rows_peak_max"] <= 16 + 1 and stream["pooled"]["kv_per_512"] < 100
    with pytest.raises(SystemExit, match="different settings"):
        _run_in_process(tmp_path / "stream", cache_dir, *small, "+method=streaming", "method.budget_rows=32")
    assert json.loads((tmp_path / "stream" / "config.json").read_text())["method"]["budget_rows"] == 16


@pytest.mark.slow  # three model-loading processes: ~30 s on an idle 2-core machine, ~80 s when it is busy
def test_sigkill_mid_run_then_resume(tmp_path, cache_dir):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled",
           "ZOOMR_CACHE": cache_dir}  # fmt: skip
    _run_in_process(tmp_path / "ref", cache_dir, *OVERRIDES)  # uninterrupted reference (what the CLI calls)
    total = N_PROBLEMS * N_SAMPLES
    assert len(_lines(tmp_path / "ref")) == total

    cut = tmp_path / "cut"
    proc = subprocess.Popen(
        _cli(cut), cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 180
    while len(_lines(cut)) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = len(_lines(cut))
    assert 3 <= killed_at < total, (
        f"the run was not killed mid-way ({killed_at} rows): {proc.stderr.read()[-2000:]}"
    )

    done = subprocess.run(_cli(cut), cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in _lines(cut)]
    keys = [(r["problem_id"], r["sample"]) for r in rows]
    assert len(keys) == total and len(set(keys)) == total
    assert _metrics(cut) == _metrics(tmp_path / "ref")
    assert "== eval aime25 | tiny-qwen2 | full ==" in done.stdout

    # a third run has nothing left to do and changes nothing
    again = subprocess.run(_cli(cut), cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and len(_lines(cut)) == total


@pytest.mark.slow  # model-loading subprocesses: CI stays under 15 min on a slow day
def test_ctrl_c_mid_run_ends_with_one_line_and_the_rerun_resumes(tmp_path, cache_dir):
    """Ctrl-C was a KeyboardInterrupt traceback through transformers; now the entry point names the run directory
    a rerun continues from, exits with the shell's 130, and the finished rows are kept and skipped."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled",
           "ZOOMR_CACHE": cache_dir}  # fmt: skip
    cut = tmp_path / "cut"
    proc = subprocess.Popen(  # SIGINT as a terminal sends it (a background job would start with it ignored)
        _cli(cut), cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 180
    while len(_lines(cut)) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    kept = len(_lines(cut))
    assert 2 <= kept < N_PROBLEMS * N_SAMPLES, f"not interrupted mid-way ({kept} rows): {err[-2000:]}"
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert f"eval: interrupted; what was written to {cut} is kept, and the same command resumes from it" in err
    _run_in_process(cut, cache_dir, *OVERRIDES)
    rows = [json.loads(line) for line in _lines(cut)]
    assert len({(r["problem_id"], r["sample"]) for r in rows}) == len(rows) == N_PROBLEMS * N_SAMPLES


def test_testbed_benchmark_scripted_and_graded_per_fact(tmp_path, cache_dir):
    """``benchmark=testbed``: the environment's tokens are exactly the problem's, the model writes the
    answers, and every row carries per-fact recall; a cap shorter than a trace is refused up front."""
    from zoomr.testbed.grading import grade

    small = ["benchmark=testbed", "model=tiny-testbed", "benchmark.options.n_test=3",
             "benchmark.options.trace_tokens=128", "generation.temperature=0", "generation.n_samples=1",
             "generation.max_new_tokens=160", "grading.workers=1", "logger=none"]  # fmt: skip
    with pytest.raises(SystemExit, match="max_new_tokens=40 cuts"):
        _run_in_process(tmp_path / "short", cache_dir, *small, "generation.max_new_tokens=40")
    metrics = _run_in_process(tmp_path / "tb", cache_dir, *small)
    assert metrics["pooled"]["samples"] == 3
    rows = [json.loads(line) for line in _lines(tmp_path / "tb")]
    from eval.testbed_task import testbed_problems

    records = {p.id: p.meta["record"] for p in testbed_problems({"n_test": 3, "trace_tokens": 128})}
    for r in rows:
        rec = records[r["problem_id"]]
        # the trace, then the scripted end of turn (this untrained model's EOS is not <|im_end|>, so it runs on)
        assert r["n_tokens"] >= rec["response_tokens"] + 1
        model = set(rec["model_writes"])
        ref = [(w, i in model) for i, w in enumerate(rec["response"].split(" ")) if w.strip()]
        words = r["text"].split()
        assert words[len(ref)] == "<|im_end|>" and any(m for _, m in ref)
        assert all(w == want for w, (want, m) in zip(words, ref) if not m)  # the script was followed
        assert r["recall"] == grade(rec, r["text"])["recall"] and len(r["recall"]) == len(rec["queries"])
        assert r["correct"] == grade(rec, r["text"])["correct"]
    assert metrics["testbed"]["recall_n"] == sum(len(r["queries"]) for r in records.values())


def test_the_runs_wandb_summary_carries_the_tasks_own_metrics():
    """W&B got the pooled metrics and accuracy per competition only: the testbed's recall by distance and RULER's /
    LongBench's subset scores, printed under the console table and kept in metrics.json, never reached it."""
    from eval.__main__ import log_summary
    from zoomr.tracking import RunLogger

    class Run:
        summary: dict = {}

    logger = RunLogger(Run(), namespace="eval")
    pooled = {"pooled": {"accuracy": 0.5, "problems": 2}, "by_competition": {"c": {"accuracy": 0.5}}}
    log_summary(logger, "testbed", {**pooled, "testbed": {"recall_all": 0.9, "recall_>256": 0.8, "recall_n": 92},
                                    "eviction": {"samples": 2}})  # fmt: skip
    assert Run.summary == {"eval/accuracy": 0.5, "eval/problems": 2, "eval/acc/c": 0.5, "eval/testbed/recall_all": 0.9,
                           "eval/testbed/recall_>256": 0.8, "eval/testbed/recall_n": 92}  # fmt: skip
    Run.summary = {}
    ruler = {"subsets": {"niah_single_1": {"samples": 2, "score": 25.0}}, "average": 25.0, "note": "text", "x": None}
    log_summary(logger, "ruler", {**pooled, "ruler": ruler})
    assert Run.summary["eval/ruler/subsets/niah_single_1/score"] == 25.0 and Run.summary["eval/ruler/average"] == 25.0
    assert "eval/ruler/note" not in Run.summary and "eval/ruler/x" not in Run.summary
    Run.summary = {}
    log_summary(logger, "math", pooled)  # a task without metrics of its own
    assert set(Run.summary) == {"eval/accuracy", "eval/problems", "eval/acc/c"}
    # how many samples the policy evicted in (summary.json's figure): a compressing arm that never evicted, i.e.
    # full KV, looked in W&B like any compressed arm
    Run.summary = {}
    log_summary(logger, "math", {**pooled, "eviction": {"samples": 2, "evicted_samples": 0, "note": "never evicted"}})
    assert Run.summary["eval/evicted_samples"] == 0 and "eval/note" not in Run.summary
