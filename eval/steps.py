"""The steps of one evaluation run: a task's problems decoded with a cache policy, graded, with resume.

The steps ``python -m eval`` runs (:mod:`eval.__main__`) and that analysis scripts call directly with a
loaded model (:func:`evaluate_arm`, e.g. ``analysis/testbed_table.py``): :func:`load_problems` (the task's
problems, its settings checked), :func:`decode_and_grade` (:func:`eval.runner.evaluate` into a run
directory, so a rerun resumes and a killed run loses no finished row) and :func:`run_metrics`
(``metrics.json``: the pooled metrics, the grader's counters, the task's own metrics, the eviction report).
In process, an arm can hand back per-sample decode details (an ``inspect`` hook on the cache after each
batch); :mod:`eval.arms` runs an arm as a ``python -m eval`` subprocess instead.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any

from eval.benchmarks import Problem
from eval.generation import Inspect
from eval.tasks import Task, get_task, write_scope
from zoomr.rundir import write_json
from zoomr.schemas import to_dataclass
from zoomr.schemas.eval import BenchmarkConfig, GenerationConfig, GradingConfig

log = logging.getLogger(__name__)

# the generation settings that decide a row's content (n_samples / batching only choose which rows exist)
# the benchmark settings that decide the problems (RULER's length sizes every prompt; the problem ids do not show it)
BENCHMARK_CONTENT = ("name", "task", "sources", "length", "option_seed", "options")
CONTENT_GENERATION = ("temperature", "top_p", "top_k", "seed", "max_new_tokens", "system_prompt", "enable_thinking")


@dataclass
class ArmRun:
    """``metrics``: what ``metrics.json`` holds; ``rows``: every (problem, sample) row, in order."""

    metrics: dict[str, Any]
    rows: list[dict[str, Any]]
    run_dir: Path


def fingerprint(model: Any, method: dict[str, Any] | None, bench: dict, gen: dict, grading: dict) -> dict[str, Any]:
    """What decides the content of a result row (``fingerprint.json``; a rerun with others is refused): the method
    without its training-only fields (:func:`zoomr.cache.registry.serving_settings`), with the digest of each file it
    loads (KVzap's surrogate: :func:`zoomr.cache.registry.served_checkpoints`)."""
    from zoomr.cache.registry import served_checkpoints, serving_settings

    return {
        "model": model,
        "method": None if method is None else {**serving_settings(method), **served_checkpoints(method)},
        "benchmark": {k: bench.get(k) for k in BENCHMARK_CONTENT},
        "generation": {k: gen[k] for k in CONTENT_GENERATION},
        "grading": {k: grading[k] for k in ("strip_reasoning", "math_verify")},
    }


def check_positions(task: Task, bench: BenchmarkConfig, model_config: Any) -> None:
    """Refuse (``ValueError``) the setting that bounds the task's prompts (RULER's ``benchmark.length``, LongBench's
    ``benchmark.options.max_prompt_tokens``: ``task.prompt_bound``) past the positions an unscaled RoPE model was
    trained on, before the prompts are built (the engine only warned at decode, after building them); past
    ``max_position_embeddings`` of a model that scales RoPE (:func:`zoomr.engine.position_limit`'s rule) it is a
    warning, up front."""
    from zoomr.engine import position_limit

    bound = task.prompt_bound(bench) if task.prompt_bound is not None else None
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    trained = getattr(text, "max_position_embeddings", None)
    if bound is None or not isinstance(trained, int) or bound[1] <= trained:
        return
    key, tokens = bound
    if position_limit(model_config) is not None:
        raise ValueError(f"{key}={tokens} is past the model's max_position_embeddings={trained} and it scales no "
                         "RoPE: positions past it were never trained, the prompts would be decoded into degraded "
                         f"outputs (nothing was written); use {key} <= {trained}")  # fmt: skip
    log.warning("%s=%d is past the model's max_position_embeddings=%d: taken as covered by its scaled RoPE (%s)",
                key, tokens, trained, getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None))


def load_problems(task: Task, bench: BenchmarkConfig, tokenizer: Any, gen: GenerationConfig) -> list[Problem]:
    """The task's problems, its generation settings checked against them (``ValueError`` / ``RuntimeError`` /
    ``FileNotFoundError`` naming the problem; nothing is written)."""
    from eval.prompts import check_chat_settings

    check_chat_settings(tokenizer, gen.enable_thinking)
    problems = task.load(bench, tokenizer, gen)
    counts = Counter(p.id for p in problems)
    if twice := [pid for pid, n in counts.items() if n > 1]:  # a repeated id was decoded and counted once per copy
        raise ValueError(f"problem ids {twice[:5]} appear more than once among benchmark {bench.name!r}'s problems "
                         f"({len(twice)} ids in all): each (problem, sample) is one result row, so every problem "
                         "needs its own id (a row repeated in a data file, or a source listed twice?)")  # fmt: skip
    task.check(problems, gen)
    check_prompt_texts(task, problems, tokenizer, gen)
    return problems


def check_prompt_texts(task: Task, problems: list[Problem], tokenizer: Any, gen: GenerationConfig) -> None:
    """Render every problem's prompt once, so a text holding a special token's string (:func:`eval.prompts.
    check_plain_text`) is refused naming the problem before anything is written (the runner renders them only
    when their batch comes)."""
    from eval.prompts import SpecialTokenInText

    for p in problems:
        try:
            task.prompt(p, tokenizer, gen.system_prompt, gen.enable_thinking)
        except SpecialTokenInText as e:
            raise ValueError(f"problem {p.id}: {e}; nothing was written (edit or drop the problem)") from None


def decode_and_grade(
    task: Task,
    problems: list[Problem],
    model: Any,
    tokenizer: Any,
    policy: dict[str, Any] | None,
    gen: GenerationConfig,
    grading: GradingConfig,
    run_dir: str | Path,
    benchmark: str,
    inspect: Inspect | None = None,
    progress: bool = True,
    stop_token_ids: list[int] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Run every missing (problem, sample) of ``task`` into ``run_dir``; (all rows in scope, grader counts).
    ``inspect`` and ``stop_token_ids``: see :func:`eval.generation.engine_generator`.
    Raises :class:`eval.grading.GraderBroken` when the grading workers keep dying (finished rows are kept)."""
    from eval.generation import engine_generator
    from eval.grading import Grader
    from eval.results import ResultStore
    from eval.runner import evaluate

    if task.scoped:
        write_scope(run_dir, problems)
    generate = engine_generator(model, tokenizer, policy, gen, inspect, stop_token_ids)
    with Grader(
        grading.workers, grading.timeout_s, grading.start_method, grading.math_verify, grading.strip_reasoning
    ) as grader:
        rows = evaluate(
            problems,
            generate,
            grader,
            ResultStore(run_dir),
            lambda p: task.prompt(p, tokenizer, gen.system_prompt, gen.enable_thinking),
            benchmark=benchmark,
            n_samples=gen.n_samples,
            batch_size=gen.batch_size,
            seed=gen.seed,
            save_token_ids=gen.save_token_ids,
            progress=progress,
            **task.hooks(tokenizer),
        )
        return rows, grader.counts()


def grading_report(counts: dict[str, int], max_error_rate: float) -> dict[str, Any]:
    """``metrics.json["grading_this_run"]``: the grader's counters and the share of samples it failed."""
    failed = counts["errors"] + counts["worker_deaths"]
    rate = failed / counts["graded"] if counts["graded"] else 0.0
    return {**counts, "failed": failed, "failure_rate": rate, "max_error_rate": max_error_rate}


def run_metrics(
    task: Task,
    rows: list[dict[str, Any]],
    counts: dict[str, int],
    max_error_rate: float,
    method: dict[str, Any] | None,
    budget: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``metrics.json``: pooled and per-competition metrics, the grader's counters, the task's own
    metrics (RULER's subsets, the testbed's recall by distance), the eviction report and the budget."""
    from eval.metrics import compute_metrics
    from eval.summary import eviction_report

    metrics = compute_metrics(rows)
    metrics["grading_timeouts_this_run"] = counts["timeouts"]
    metrics["grading_this_run"] = grading_report(counts, max_error_rate)
    metrics.update(task.metrics(rows))
    metrics["eviction"] = eviction_report(rows, method)
    metrics["budget"] = budget
    return metrics


def _plain(obj: Any) -> dict[str, Any]:
    return asdict(obj) if is_dataclass(obj) else dict(obj or {})


def evaluate_arm(
    model: Any,
    tokenizer: Any,
    benchmark: BenchmarkConfig | dict[str, Any],
    policy: dict[str, Any] | None,
    run_dir: str | Path,
    generation: GenerationConfig | dict[str, Any] | None = None,
    grading: GradingConfig | dict[str, Any] | None = None,
    inspect: Inspect | None = None,
    progress: bool = True,
    stop_token_ids: list[int] | None = None,
) -> ArmRun:
    """One arm (a loaded model, a benchmark, a cache policy config; None = full KV) through the evaluator
    into ``run_dir``: finished rows are kept and skipped when rerun, other settings in the same directory
    are refused. ``benchmark`` / ``generation`` / ``grading`` are the eval config's nodes (dicts of their
    fields or the dataclasses; unset fields keep their defaults). ``inspect(cache, i, output)`` adds
    per-sample decode details to the rows (``row["decode"]``; e.g. ZoomR's recompute log);
    ``stop_token_ids`` end a sample (None: the model's EOS). Writes ``results.jsonl``, ``fingerprint.json``
    and ``metrics.json``."""
    from eval.results import check_fingerprint
    from zoomr.runlock import RunLock

    bench = benchmark if isinstance(benchmark, BenchmarkConfig) else to_dataclass(BenchmarkConfig, benchmark)
    gen = generation if isinstance(generation, GenerationConfig) else to_dataclass(GenerationConfig, generation or {})
    grade = grading if isinstance(grading, GradingConfig) else to_dataclass(GradingConfig, grading or {})
    task = get_task(bench.task)
    check_positions(task, bench, model.config)
    problems = load_problems(task, bench, tokenizer, gen)
    model_id = getattr(model, "name_or_path", None) or type(model).__name__
    with RunLock(run_dir):
        fp = fingerprint(str(model_id), policy, _plain(bench), _plain(gen), _plain(grade))
        check_fingerprint(run_dir, {**fp, "stop_token_ids": stop_token_ids})
        rows, counts = decode_and_grade(
            task, problems, model, tokenizer, policy, gen, grade, run_dir, bench.name, inspect, progress, stop_token_ids
        )
    metrics = run_metrics(task, rows, counts, grade.max_error_rate, policy)
    write_json(Path(run_dir) / "metrics.json", metrics)  # a kill leaves the old file or the new one
    return ArmRun(metrics, rows, Path(run_dir))
