"""Issue 18 defects 6-7 and issue 17 part 3: huge integers are simply graded; errors and worker deaths are
counted, reported in metrics.json, fail the run above grading.max_error_rate and are regraded on rerun;
the pool reuses its workers, sends batches and still times every sample on its own."""

from __future__ import annotations

import json

import pytest
from grading_doubles import always_raises, dies, raises_on_boom, sleeps
from hydra import compose, initialize_config_dir

import eval.grading
from eval.__main__ import run
from eval.benchmarks import Problem
from eval.generation import Generation
from eval.grading import Grader, GraderBroken, normalize
from eval.results import RESULTS_FILE, ResultStore
from eval.runner import evaluate
from zoomr.entry import CONF_DIR
from zoomr.schemas import register_with_hydra

register_with_hydra()
BIG = "1" * 5000  # past Python's 4,300-digit limit for int <-> str


def test_integers_longer_than_4300_digits_are_graded():
    assert normalize("00" + BIG) == BIG and normalize("+" + BIG) == BIG and normalize("-0" + BIG) == "-" + BIG
    assert normalize("-000") == "0" and normalize("+7") == "7" and normalize("007") == "7"
    samples = [(f"\\boxed{{{BIG}}}", BIG), (f"\\boxed{{{BIG}2}}", BIG),
               ("\\boxed{7}", BIG), (f"\\boxed{{{BIG}}}", "7")]  # fmt: skip
    with Grader(workers=1) as g:
        grades = g.grade(samples)
    assert [x.correct for x in grades] == [True, False, False, False]
    assert grades[0].method == "exact" and g.failures == 0


def test_errors_and_deaths_are_counted():
    samples = [("1", "1"), ("boom", "1"), ("2", "1")]
    with Grader(workers=1, exact_first=False, check=raises_on_boom) as g:
        grades = g.grade(samples)
    assert [x.method for x in grades] == ["math_verify", "error", "none"]
    assert g.counts() == {"graded": 3, "timeouts": 0, "errors": 1, "worker_deaths": 0, "worker_restarts": 0}


def test_workers_that_always_die_stop_the_grader():
    with Grader(workers=1, exact_first=False, check=dies) as g, pytest.raises(GraderBroken, match="exit code 7"):
        g.grade([(str(i), "1") for i in range(10)])
    assert g.deaths == 2 and g.restarts == 2  # two samples graded "error", the third death stops it


def test_workers_are_reused_and_each_sample_has_its_own_deadline():
    # 4 samples of 0.5 s sent to one worker in one batch: each finishes within the 1.2 s limit, although
    # the last finishes 2 s after the batch was sent
    with Grader(workers=1, timeout_s=1.2, exact_first=False, check=sleeps) as g:
        grades = g.grade([("0.5", "x")] * 4)
        pid = g._workers[0].proc.pid
        g.grade([("0.01", "x")] * 3)
        assert g._workers[0].proc.pid == pid  # the same process graded both calls
    assert [x.method for x in grades] == ["math_verify"] * 4 and g.timeouts == 0 and g.restarts == 0


def test_ctrl_c_leaves_the_workers_to_the_parent():
    """Ctrl-C reaches the whole process group: each worker printed its own KeyboardInterrupt traceback under the
    run's one-line "interrupted" (and died); the parent's Grader.close stops them."""
    import os
    import signal
    import time

    with Grader(workers=1, exact_first=False, check=raises_on_boom) as g:
        g.start()
        worker = g._workers[0].proc
        os.kill(worker.pid, signal.SIGINT)
        time.sleep(0.5)
        assert worker.is_alive() and [x.method for x in g.grade([("1", "1")])] == ["math_verify"]
        assert g.deaths == 0 and g.restarts == 0
    assert not worker.is_alive()


PROBLEMS = [Problem(id=f"t/{i}", question=f"Q{i}", answer="boom", competition="c") for i in range(3)]


def _generate(prompts, seeds):
    return [Generation("boom" if p == "Q1" else "5", [1, 2], False, 2) for p in prompts]


def test_rows_whose_grading_failed_are_regraded_without_generating(tmp_path):
    def run_once(check, generate):
        with Grader(workers=1, exact_first=False, check=check) as grader:
            rows = evaluate(PROBLEMS, generate, grader, ResultStore(tmp_path, fsync=False), lambda p: p.question,
                            benchmark="toy", n_samples=1, batch_size=3, seed=0, progress=False)  # fmt: skip
            return rows, grader.counts()

    rows, counts = run_once(raises_on_boom, _generate)
    assert [r["grade_method"] for r in rows] == ["none", "error", "none"] and counts["errors"] == 1

    def no_generation(prompts, seeds):
        raise AssertionError("nothing is generated again")

    rows, counts = run_once(eval.grading.math_verify_equal, no_generation)
    assert [r["grade_method"] for r in rows] == ["none", "none", "none"] and counts["graded"] == 1
    assert len((tmp_path / RESULTS_FILE).read_text().splitlines()) == 4


class _FailingGrader(Grader):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs, exact_first=False, check=always_raises)


def test_eval_run_fails_above_the_error_threshold_and_the_rerun_regrades(tmp_path, cache_dir, monkeypatch):
    overrides = ["benchmark=aime25", "benchmark.problem_limit=2", "generation.n_samples=1", "generation.temperature=0",
                 "generation.max_new_tokens=6", "grading.workers=1", "logger=none", f"run_dir={tmp_path}",
                 f"cache_dir={cache_dir}"]  # fmt: skip
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("eval", overrides=overrides)
    monkeypatch.setattr(eval.grading, "Grader", _FailingGrader)
    with pytest.raises(SystemExit, match=r"grading failed for 2 of 2 samples \(2 math-verify errors"):
        run(cfg)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["grading_this_run"]["errors"] == 2 and metrics["grading_this_run"]["failure_rate"] == 1.0
    monkeypatch.undo()
    metrics = run(cfg)  # the rerun grades the two rows again with the real grader
    assert metrics["grading_this_run"] == {**metrics["grading_this_run"], "graded": 2, "failed": 0}
    assert metrics["pooled"]["grade_methods"] == {"none": 2}


def test_bench_grading_pairs_the_pool_with_the_plain_loop(tmp_path, capsys):
    from eval.bench_grading import main

    assert main(["--samples", "24", "--repeats", "1", "--workers", "1", "--pathological", "1", "--timeout", "3",
                 "--out", str(tmp_path)]) == 0  # fmt: skip
    out = json.loads((tmp_path / "bench_grading.json").read_text())
    (row,) = out["rows"]
    assert row["agree_with_plain"] == 24 and row["speedup_median"] > 0 and row["counts"]["errors"] == 0
    assert out["timeout_check"]["seconds"] <= out["timeout_check"]["bound_s"]
    assert "| workers | plain loop s | pool s |" in capsys.readouterr().out


def test_a_worker_answers_half_its_batch_before_finishing_it():
    """The worker flushes once half a batch is done, so the parent can top it up before it runs dry."""
    import multiprocessing as mp
    import threading
    import time

    from eval.grading import IDLE, READY, _worker_loop

    release = threading.Event()

    def check(text: str, gold: str, inner_timeout: int) -> tuple[str, bool]:
        if text == "hold":
            release.wait(10)
        return text, text == gold

    parent, child = mp.Pipe()
    status = [IDLE, 0.0]
    worker = threading.Thread(target=_worker_loop, args=(child, 1, check, status, 60.0), daemon=True)
    worker.start()
    try:
        assert parent.recv() == READY
        parent.send([(0, "a", "a"), (1, "b", "x"), (2, "hold", "hold"), (3, "c", "c")])
        assert parent.poll(5), "no answers before the batch's second half finished"
        first = parent.recv()
        assert [(i, g.correct) for i, g in first] == [(0, True), (1, False)]
        deadline = time.monotonic() + 5
        while status[0] != 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert status[0] == 2  # the third sample is still running
        release.set()
        assert parent.poll(5)
        assert [(i, g.correct) for i, g in parent.recv()] == [(2, True), (3, True)]
    finally:
        release.set()
        parent.send(None)
        worker.join(5)
    assert not worker.is_alive()
