"""The recall testbed as an evaluator task (``benchmark=testbed``; the task itself is :mod:`zoomr.testbed`).

Problems are generated from ``benchmark.options`` (:class:`zoomr.schemas.testbed.TestbedData` fields;
``n_test`` problems from ``test_seed``), the prompt is the testbed's own (its model knows no instruction),
the environment writes the trace's random facts through the decode engine's script
(:func:`zoomr.testbed.grading.script_ids`) and the model writes every answer. A sample is correct when
its final ``\\boxed{}`` holds exactly the gold queries and answers; every row carries per-fact recall
with the reference distance, and ``metrics.json["testbed"]`` pools recall by distance bucket.
:func:`testbed_arm` runs one cache-policy arm of a loaded checkpoint through the evaluator (the analysis
scripts' arms, ``analysis/testbed_table.py``, ``analysis/zoomr_testbed.py``).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eval.benchmarks import Problem
from eval.generation import Generation, Inspect
from eval.grading import Grade
from eval.tasks import Task

if TYPE_CHECKING:
    from eval.steps import ArmRun


def testbed_problems(options: dict[str, Any]) -> list[Problem]:
    """The recall testbed's fixed test set, generated from ``options`` (``TestbedData`` fields)."""
    from zoomr.schemas.testbed import TestbedData
    from zoomr.testbed.grading import load_test_problems

    try:
        cfg = TestbedData(**options)
    except TypeError as e:
        raise ValueError(f"benchmark.options for the testbed: {e}") from None
    return [
        Problem(r["id"], r["prompt"], r["answer"], "testbed", "testbed", meta={"record": r})
        for r in load_test_problems(cfg)
    ]


def exact_answer(text: str, gold: str) -> Grade:
    """The final ``\\boxed{}`` against the gold queries and answers, word for word."""
    from zoomr.testbed.grading import grade_answer

    extracted, ok = grade_answer(text, gold)
    return Grade(extracted, ok, "exact" if ok else "none")


class TestbedTask(Task):
    """``benchmark=testbed``: generated problems, the environment's script, exact grading, recall by distance."""

    __test__ = False  # not a pytest class despite the name
    name = "testbed"
    arm_options = ("thought_splitter",)  # LightThinker's thought ends: same problems, one more model-written token each
    answer_check = staticmethod(exact_answer)

    def option_defaults(self) -> dict[str, Any]:
        from zoomr.schemas.testbed import TestbedData

        return asdict(TestbedData())

    def load(self, bench: Any, tokenizer: Any = None, gen: Any = None) -> list[Problem]:
        if list(bench.sources) != ["testbed"]:
            raise ValueError(f"benchmark.sources of the testbed must be [testbed], got {list(bench.sources)}")
        if tokenizer is not None:
            from zoomr.testbed.vocab import check_tokenizer

            check_tokenizer(tokenizer)  # the scripts are written in the testbed's words
        problems = testbed_problems(dict(bench.options or {}))
        return problems[: bench.problem_limit] if bench.problem_limit is not None else problems

    def check(self, problems: list[Problem], gen: Any) -> None:
        longest = max(p.meta["record"]["response_tokens"] + 1 for p in problems)
        if gen.max_new_tokens < longest:
            raise ValueError(
                f"generation.max_new_tokens={gen.max_new_tokens} cuts the traces short; the longest needs "
                f"{longest} (set generation.max_new_tokens={longest} or more)"
            )

    def check_policy(self, problems: list[Problem], method: Any | None) -> None:
        from zoomr.tokens import BEGIN_SUMMARY, SPLITTER

        def field(key: str) -> Any:  # a method config as a dict or a dataclass (None: full KV)
            return method.get(key) if isinstance(method, dict) else getattr(method, key, None)

        policy, name = field("policy"), field("name") or field("policy")
        response = problems[0].meta["record"]["response"]
        if policy == "lightthinker" and SPLITTER not in response:
            raise ValueError(
                "the script writes every paragraph break and leaves the model no place to end a thought, so no "
                f"{SPLITTER} is ever written (it would decode as full KV); set +benchmark.options.thought_splitter=true"
            )
        if policy in ("zoomr", "sumr") and BEGIN_SUMMARY not in response:
            raise ValueError(
                f"these traces have no summaries, so {name} has no segments to select (it would only keep the "
                "prompt and its window); set ++benchmark.options.summaries=true on a model trained with them "
                "(data=testbed_summaries)"
            )

    def check_model(self, bench: Any, model_path: str | None) -> None:
        from zoomr.models import is_local_path
        from zoomr.schemas.testbed import TestbedData
        from zoomr.testbed.checkpoint import format_differences, training_streams

        if not model_path or not is_local_path(model_path):
            return
        data = TestbedData(**dict(bench.options or {}))
        if (trained_on := training_streams(model_path).get(data.test_seed)) is not None:
            raise ValueError(f"benchmark.options.test_seed={data.test_seed} is the stream {trained_on} was trained on: "
                             "the test problems would be training problems; test seeds are 1000003 and up")  # fmt: skip
        if differ := format_differences(model_path, data):
            wrong = ", ".join(f"{f}={given} (trained on {trained})" for f, (trained, given) in differ.items())
            raise ValueError(f"{model_path} was trained on another query format: benchmark.options {wrong}; set "
                             "++benchmark.options.<field> to what the model was trained on")  # fmt: skip

    def script(self, problem: Problem, tokenizer: Any) -> list[int | None]:
        from zoomr.testbed.grading import script_ids

        return script_ids(problem.meta["record"], tokenizer)

    def details(self, problem: Problem, generation: Generation) -> dict[str, Any]:
        from zoomr.testbed.grading import grade

        g = grade(problem.meta["record"], generation.text)
        return {"recall": g["recall"], "recall_accuracy": g["recall_accuracy"]}

    def metrics(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """Per-fact recall by reference distance, pooled over rows."""
        from zoomr.testbed.grading import summarize

        return {"testbed": {k: v for k, v in summarize(rows).items() if k.startswith("recall")}}

    def report(self, metrics: dict[str, Any], table: str) -> str:
        recall = metrics["testbed"]
        return table + "\n" + "  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in recall.items())


TESTBED = TestbedTask()


def decode_stats(cache: Any, index: int, output: Any) -> dict[str, Any]:
    """An ``inspect`` hook (:func:`eval.generation.engine_generator`): the mean decode step time (prefill
    excluded; the batch's wall time per step) and the response tokens the environment wrote."""
    step_s = output.stats.step_s
    return {"step_s": float(step_s[1:].mean()) if len(step_s) > 1 else None, "n_scripted": output.n_scripted}


def testbed_arm(
    model: Any,
    tokenizer: Any,
    data: Any,
    n: int,
    policy: dict[str, Any] | None,
    run_dir: str | Path,
    batch_size: int = 64,
    inspect: Inspect | None = decode_stats,
) -> ArmRun:
    """One cache-policy arm on ``n`` test problems of ``data`` (a ``TestbedData``) through the evaluator,
    greedy, into ``run_dir`` (resumed when rerun): :func:`eval.steps.evaluate_arm` with ``benchmark=testbed``.
    The cap is the longest trace plus its end of turn plus 8 tokens; a sample ends at the end of turn
    ``<|im_end|>`` the script writes, whatever EOS the checkpoint was saved with (``python -m eval`` stops at
    the model's EOS)."""
    from eval.steps import evaluate_arm
    from zoomr import tokens

    options = {**asdict(data), "n_test": n}
    longest = max(p.meta["record"]["response_tokens"] for p in testbed_problems(options))
    bench = {"name": "testbed", "task": "testbed", "sources": ["testbed"], "options": options}
    gen = {"temperature": 0.0, "n_samples": 1, "batch_size": batch_size, "max_new_tokens": longest + 1 + 8}
    stop = [tokenizer.convert_tokens_to_ids(tokens.IM_END)]
    return evaluate_arm(model, tokenizer, bench, policy, run_dir, generation=gen, inspect=inspect, stop_token_ids=stop)
