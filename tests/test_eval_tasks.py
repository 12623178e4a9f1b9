"""The evaluator's task protocol (eval/tasks.py): every benchmark names a registered task, the evaluator's
core names none, and one arm runs through the evaluator with resume and per-sample decode details."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from eval.tasks import TASKS, Task, get_task
from zoomr.paths import REPO_ROOT


@pytest.mark.parametrize("path", sorted((REPO_ROOT / "conf" / "benchmark").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_benchmark_config_names_a_registered_task(path):
    task = OmegaConf.load(path).task
    assert isinstance(get_task(task), Task) and get_task(task).name == task


def test_an_unknown_task_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="unknown benchmark.task 'nope'; known: math|gpqa|testbed"):
        get_task("nope")


@pytest.mark.parametrize("task", ["math", "gpqa"])
def test_options_given_to_a_benchmark_that_takes_none_are_refused(task):
    """``benchmark=aime25 ++benchmark.options.x=1`` ran and ignored the option (testbed, RULER and LongBench refuse
    keys they do not know)."""
    from zoomr.schemas.eval import BenchmarkConfig

    bench = BenchmarkConfig(name="aime25", task=task, sources=["aime_2025"], options={"x": 1}, problem_limit=2)
    with pytest.raises(ValueError, match=r"benchmark.options \['x'\]: benchmark 'aime25' takes no options"):
        get_task(task).load(bench)
    assert len(get_task("math").load(BenchmarkConfig(name="aime25", sources=["aime_2025"], problem_limit=2))) == 2


@pytest.mark.parametrize("module", ["__main__", "grading", "prompts", "runner", "steps", "generation"])
def test_the_evaluator_core_names_no_task(module):
    """Tasks are plugged in through the registry: no string literal of the evaluator's core is a task name."""
    tree = ast.parse((REPO_ROOT / "eval" / f"{module}.py").read_text())
    names = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert names & set(TASKS) == set()


@pytest.fixture(scope="module")
def testbed_model(cache_dir):
    from hydra import compose, initialize_config_dir

    from zoomr.entry import CONF_DIR, model_spec
    from zoomr.models import load_model, load_tokenizer
    from zoomr.schemas import register_with_hydra

    register_with_hydra()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("eval", overrides=["model=tiny-testbed"])
    spec = model_spec(cfg)
    return load_model(spec, cache_dir).eval(), load_tokenizer(spec, cache_dir)


def test_an_arm_through_the_evaluator_resumes_and_keeps_decode_details(testbed_model, tmp_path):
    """``eval.steps.evaluate_arm`` (via ``testbed_arm``): the inspect hook sees the arm's own cache and the
    engine's output; a sample ends at the end of turn; a rerun decodes nothing and returns the same rows;
    other settings are refused."""
    from eval.results import RESULTS_FILE
    from eval.testbed_task import testbed_arm, testbed_problems
    from zoomr.schemas.testbed import TestbedData

    model, tok = testbed_model
    data = TestbedData(trace_tokens=128)
    policy = {"policy": "streaming", "budget_rows": 32, "n_sink": 4}
    seen = []

    def inspect(cache, i, out):
        seen.append(type(cache).__name__)
        return {"n_scripted": out.n_scripted, "steps": cache.steps_done}

    arm = testbed_arm(model, tok, data, 3, policy, tmp_path / "arm", batch_size=2, inspect=inspect)
    records = {p.id: p.meta["record"] for p in testbed_problems({**vars(data), "n_test": 3})}
    assert [r["problem_id"] for r in arm.rows] == list(records) and set(seen) == {"StreamingCache"}
    for r in arm.rows:
        rec = records[r["problem_id"]]
        # the environment wrote every trace token the model does not write, then the end of turn
        assert r["decode"]["n_scripted"] == rec["response_tokens"] - len(rec["model_writes"]) + 1
        assert r["kv"]["rows_peak"] <= 32 + 1 and len(r["recall"]) == len(rec["queries"])
        assert r["n_tokens"] == rec["response_tokens"] + 1  # ends at the scripted <|im_end|> (not the model's EOS)
    assert arm.metrics["testbed"]["recall_n"] == sum(len(r["queries"]) for r in records.values())
    assert json.loads((tmp_path / "arm" / "metrics.json").read_text())["pooled"]["samples"] == 3

    lines = (tmp_path / "arm" / RESULTS_FILE).read_text()
    seen.clear()
    again = testbed_arm(model, tok, data, 3, policy, tmp_path / "arm", batch_size=2, inspect=inspect)
    assert seen == [] and again.rows == arm.rows  # resumed rows read back equal to the fresh ones
    assert (tmp_path / "arm" / RESULTS_FILE).read_text() == lines
    with pytest.raises(SystemExit, match="different settings"):
        testbed_arm(model, tok, data, 3, {**policy, "budget_rows": 48}, tmp_path / "arm", batch_size=2)


def test_a_testbed_cap_shorter_than_a_trace_is_refused_before_anything_is_written(testbed_model, tmp_path):
    from eval.steps import evaluate_arm

    model, tok = testbed_model
    bench = {"name": "testbed", "task": "testbed", "sources": ["testbed"], "options": {"n_test": 2, "trace_tokens": 128}}
    with pytest.raises(ValueError, match="max_new_tokens=40 cuts the traces short"):
        evaluate_arm(model, tok, bench, None, tmp_path / "short", generation={"max_new_tokens": 40})
    assert not Path(tmp_path / "short").exists()
