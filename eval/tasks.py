"""Tasks: what a benchmark brings to the evaluator, looked up by ``benchmark.task`` (lighteval-style).

A :class:`Task` says how to

- ``load(bench, tokenizer, gen)`` its problems (``scoped`` tasks generate them with the model's tokenizer
  or read them from the hub, so a run records their ids in ``problems.json``);
- ``check(problems, gen)`` the generation settings against them (before anything is written);
- ``prompt(problem, tokenizer, system_prompt, enable_thinking)`` render one problem for the model;
- ``script(problem, tokenizer)`` the environment's tokens, if the task has an environment (the testbed);
- grade a sample: ``answer_check(text, gold)`` inside the shared :class:`eval.grading.Grader` (None: the
  grader's own math stages, exact then math-verify), or ``grade(problem, generation)`` on its own;
- ``details(problem, generation)`` extra per-sample fields of its rows;
- ``metrics(rows)`` its entries in ``metrics.json`` and ``report(metrics, table)`` its console lines.

:data:`TASKS` names the module and object of every task (imported on first use): math and GPQA
(:mod:`eval.math_tasks`), the recall testbed (:mod:`eval.testbed_task`), RULER and LongBench
(:class:`ScoredTask`). The evaluator itself names no task.

A :class:`ScoredTask` (RULER, LongBench) scores each sample with ``score(problem, text)`` in [0, 1] on the
output cut to the problem's budget (``meta["max_new_tokens"]``; greedy decoding to a larger cap and
cutting is the same as decoding to the budget, so one run serves subsets with different budgets), writing
``score`` into every row (``correct`` = score 1.0), and aggregates per subset (``competition``) and
averaged with ``summarize`` into ``metrics.json[<task>]``, next to each subset's mean achieved compression
(fraction of KV pairs removed, from the rows' ``kv.compression`` / ``kv.prefill_compression``; kvpress's
definition). Its problems carry their rendered prompt in ``meta["prompt"]``.
"""

from __future__ import annotations

import importlib
import logging
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from eval.benchmarks import Problem
from eval.generation import Generation
from eval.grading import Grade
from zoomr.jsonl import read_json
from zoomr.paths import MissingInput
from zoomr.rundir import write_json

log = logging.getLogger(__name__)

SCOPE_FILE = "problems.json"  # a scoped run's problem ids, written before decoding

# benchmark.task -> "module:object" of its Task (imported on first use)
TASKS = {
    "math": "eval.math_tasks:MATH",
    "gpqa": "eval.math_tasks:GPQA",
    "testbed": "eval.testbed_task:TESTBED",
    "ruler": "eval.ruler:TASK",
    "longbench": "eval.longbench:TASK",
}


class Task:
    """The evaluator's view of one benchmark task; every method has a default (see the module docs)."""

    name: ClassVar[str] = ""
    scoped: ClassVar[bool] = False  # problems cannot be listed again without the tokenizer / the hub
    takes_length: bool = False  # problems generated to benchmark.length tokens (elsewhere the setting is refused)
    # the setting that bounds every prompt's tokens and its value (None: unbounded), checked against the model's positions
    prompt_bound: Callable[[Any], tuple[str, int] | None] | None = None
    # benchmark options a method sets without changing the problems; arms that differ in them stay comparable
    arm_options: ClassVar[tuple[str, ...]] = ()

    def option_defaults(self) -> dict[str, Any]:
        """``benchmark.options`` a run that does not record them ran with (an option added after the run was made
        takes its default value there); comparisons fill them in before they look for differing settings."""
        return {}

    def load(self, bench: Any, tokenizer: Any = None, gen: Any = None) -> list[Problem]:
        from eval.benchmarks import load_benchmark

        if given := sorted(getattr(bench, "options", None) or {}):  # ++benchmark.options.x=1 was ignored silently
            raise ValueError(f"benchmark.options {given}: benchmark {bench.name!r} takes no options (its settings are "
                             "benchmark.sources, source, data_dir, problem_limit, option_seed)")  # fmt: skip
        return load_benchmark(bench)

    def check(self, problems: list[Problem], gen: Any) -> None:
        """Refuse (``ValueError``) or warn about generation settings that do not fit the problems."""

    def check_policy(self, problems: list[Problem], method: Any | None) -> None:
        """Refuse (``ValueError``) a cache policy the problems give nothing to work on."""

    def check_model(self, bench: Any, model_path: str | None) -> None:
        """Refuse (``ValueError``) problems in a format the model at ``model_path`` (a local checkpoint or a hub
        id) was not trained to read."""

    def user_message(self, problem: Problem) -> str:
        return problem.question

    def prompt(
        self, problem: Problem, tokenizer: Any, system_prompt: str | None = None, enable_thinking: bool | None = None
    ) -> str:
        """The user message through the model's chat template, the generation prompt appended."""
        from eval.prompts import chat_text

        return chat_text(self.user_message(problem), tokenizer, system_prompt, enable_thinking)

    # the environment's tokens per problem (None where the model writes); None: no environment
    script: Callable[[Problem, Any], list[int | None]] | None = None
    # the grader's check of one (text, gold); None: the grader's math stages (exact, then math-verify)
    answer_check: Callable[[str, str], Grade] | None = None
    # a grade of one sample outside the shared grader (replaces answer_check)
    grade: Callable[[Problem, Generation], Grade] | None = None

    def details(self, problem: Problem, generation: Generation) -> dict[str, Any]:
        return {}

    def metrics(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """The task's own entries of ``metrics.json`` (beside the pooled metrics)."""
        return {}

    def report(self, metrics: dict[str, Any], table: str) -> str:
        """The console table with the task's own lines."""
        return table

    def hooks(self, tokenizer: Any) -> dict[str, Any]:
        """The keyword hooks of :func:`eval.runner.evaluate` for this task."""
        out: dict[str, Any] = {"details": self.details, "check": self.answer_check}
        if self.script is not None:
            out["script"] = lambda p: self.script(p, tokenizer)
        if self.grade is not None:
            out["grade"] = self.grade
        return out


def get_task(name: str) -> Task:
    """The task of ``benchmark.task`` (``ValueError`` naming the known ones)."""
    if name not in TASKS:
        raise ValueError(f"unknown benchmark.task {name!r}; known: {'|'.join(TASKS)}")
    module, _, attr = TASKS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def user_message(problem: Problem) -> str:
    """The user message of ``problem`` as its task writes it."""
    return get_task(problem.task).user_message(problem)


def render(
    problem: Problem, tokenizer: Any, system_prompt: str | None = None, enable_thinking: bool | None = None
) -> str:
    """The prompt text of ``problem`` as its task renders it (the model's chat template)."""
    return get_task(problem.task).prompt(problem, tokenizer, system_prompt, enable_thinking)


def write_scope(run_dir: str | Path, problems: list[Problem]) -> None:
    """Record the run's problem ids: generated / hub problems cannot be listed again without the model's
    tokenizer or the hub, so :func:`eval.compare.load_run` reads the scope from here."""
    write_json(Path(run_dir) / SCOPE_FILE, [p.id for p in problems])


def read_scope(run_dir: str | Path) -> list[str]:
    path = Path(run_dir) / SCOPE_FILE
    if not path.exists():
        raise MissingInput(
            f"{run_dir}: no {SCOPE_FILE} (a RULER / LongBench run writes it when it starts)"
        )
    return read_json(path, "problem scope")


def limit_per_subset(problem_limit: int | None, available: int) -> int:
    """``benchmark.problem_limit`` for a multi-subset benchmark: the first N problems of each subset."""
    if problem_limit is not None and problem_limit < 1:
        raise ValueError(f"benchmark.problem_limit must be >= 1, got {problem_limit}")
    return available if problem_limit is None else min(problem_limit, available)


def scored_text(generation: Generation, budget: int, tokenizer: Any) -> str:
    """The output cut to its first ``budget`` tokens (decoded as the engine decodes)."""
    if generation.n_tokens <= budget:
        return generation.text
    return tokenizer.decode(generation.token_ids[:budget], skip_special_tokens=False)


class ScoredTask(Task):
    """A multi-subset benchmark scored in [0, 1] per sample: ``load(bench, tokenizer, gen) -> problems``;
    ``score(problem, text) -> [0, 1]``; ``summarize(subset scores in %) -> averages`` (e.g. LongBench's
    with and without TREC)."""

    scoped = True

    def __init__(
        self,
        name: str,
        load: Callable[[Any, Any, Any], list[Problem]],
        score: Callable[[Problem, str], float],
        summarize: Callable[[dict[str, float]], dict[str, float]],
        takes_length: bool = False,
        prompt_bound: Callable[[Any], tuple[str, int] | None] | None = None,
    ):
        self.name, self.load, self.score, self.summarize = name, load, score, summarize  # type: ignore[misc,method-assign]
        self.takes_length, self.prompt_bound = takes_length, prompt_bound

    def prompt(self, problem: Problem, tokenizer: Any, *_: Any) -> str:
        return problem.meta["prompt"]  # rendered by load (RULER opens the reply with its answer prefix)

    def check(self, problems: list[Problem], gen: Any) -> None:
        """Warn when the generation cap is below a problem's budget (its output is then cut shorter)."""
        need = max((p.meta["max_new_tokens"] for p in problems), default=0)
        if gen.max_new_tokens < need:
            log.warning(
                "generation.max_new_tokens=%d is below the largest task budget (%d tokens): outputs are scored "
                "as generated; set generation.max_new_tokens=%d for the benchmark's budgets",
                gen.max_new_tokens, need, need,
            )  # fmt: skip

    def hooks(self, tokenizer: Any) -> dict[str, Any]:
        def scored(problem: Problem, generation: Generation) -> tuple[str, float]:
            text = scored_text(generation, problem.meta["max_new_tokens"], tokenizer)
            return text, self.score(problem, text)

        def details(problem: Problem, generation: Generation) -> dict[str, Any]:
            _, s = scored(problem, generation)
            return {"score": s, "scored_tokens": min(problem.meta["max_new_tokens"], generation.n_tokens)}

        def grade(problem: Problem, generation: Generation) -> Grade:
            text, s = scored(problem, generation)
            return Grade(text.strip()[:200], s >= 1.0, self.name)

        return {"grade": grade, "details": details}

    def metrics(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {self.name: subset_metrics(self, rows)}

    def report(self, metrics: dict[str, Any], table: str) -> str:
        return (format_subset_table(self.name, metrics[self.name]) + "\n" + table + f"\n{self.name}: avg@k and pass@k "
                "count the samples with a full score (score 1); the benchmark's score is the mean above")  # fmt: skip


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def subset_metrics(task: ScoredTask, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per subset: problems, mean score (%), mean compression and prefill compression; plus the averages."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[r["competition"]].append(r)
    subsets = {}
    for name, g in groups.items():
        kv = [r.get("kv") or {} for r in g]
        subsets[name] = {
            "samples": len(g),
            "score": 100 * float(np.mean([r["score"] for r in g])),
            "compression": _mean([k["compression"] for k in kv if "compression" in k]),
            "prefill_compression": _mean(
                [k["prefill_compression"] for k in kv if "prefill_compression" in k]
            ),
        }
    scores = {name: m["score"] for name, m in subsets.items()}
    comp = [m["compression"] for m in subsets.values() if m["compression"] is not None]
    return {
        "subsets": subsets,
        **task.summarize(scores),
        "compression": _mean(comp),
    }


def format_subset_table(name: str, metrics: dict[str, Any]) -> str:
    """The per-subset table (score in %, compression = fraction of KV pairs removed), averages last."""
    head = f"{name + ' subset':<24} {'samples':>8} {'score':>8} {'compr.':>8} {'prefill':>8}"
    lines = [head, "-" * len(head)]

    def fmt(x: float | None) -> str:
        return f"{x:>8.3f}" if x is not None else f"{'-':>8}"

    for sub, m in metrics["subsets"].items():
        lines.append(
            f"{sub:<24} {m['samples']:>8} {m['score']:>8.2f} {fmt(m['compression'])} {fmt(m['prefill_compression'])}"
        )
    lines.append("-" * len(head))
    for key, v in metrics.items():
        if key.startswith("average") and v is not None:
            lines.append(f"{key:<24} {'':>8} {v:>8.2f}")
    if metrics.get("compression") is not None:
        lines.append(f"{'mean compression':<24} {'':>8} {'':>8} {metrics['compression']:>8.3f}")
    return "\n".join(lines)
