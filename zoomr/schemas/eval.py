"""Schemas of the evaluator (``python -m eval``): benchmarks, generation settings, grading.

``conf/benchmark/*.yaml`` opt into ``/schema/benchmark/benchmark``; ``conf/eval.yaml`` places
``/schema/eval/generation`` and ``/schema/eval/grading`` at its ``generation`` / ``grading`` keys.
Paper values (AbridgeKV §4, "Evaluation conventions" in shared/specs/METHODS.md) are in comments;
the defaults are small enough for a tiny model on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class BenchmarkConfig:
    """Which problems to evaluate.

    ``sources``: names from :data:`eval.benchmarks.SOURCES` (one vendored file each, with its hub id).
    ``source``: ``local`` reads the files vendored under ``data_dir``; ``hub`` loads the same sets
    with ``datasets.load_dataset`` (needs hub access). ``task``: ``math`` (boxed answer),
    ``gpqa`` (multiple choice, ``Answer: X``) or ``testbed`` (the synthetic recall testbed, generated
    from ``options``: the :class:`zoomr.schemas.testbed.TestbedData` fields, graded exactly).
    ``problem_limit``: first N problems (quick runs).
    """

    name: str = "math500"
    task: str = "math"
    sources: list[str] = field(default_factory=lambda: ["math500"])
    source: str = "local"
    data_dir: str = "eval/data/benchmarks"
    problem_limit: int | None = None  # multi-subset plugin tasks (ruler, longbench): first N of each subset
    length: int | None = None  # generated long-context sets (RULER): tokens per example, prompt + generation
    option_seed: int = 1234  # GPQA: options shuffled per question with this seed (same order in every arm)
    options: dict[str, Any] = field(default_factory=dict)  # settings of a generated source (testbed)
    paper_samples: int | None = None  # documentation only: samples per problem in the papers
    paper_max_new_tokens: int | None = None  # documentation only: generation cap in the papers


@dataclass
class GenerationConfig:
    """Sampling settings (AbridgeKV: T=0.6, top-p 0.95, top-k 20, seed 1234; 8 samples and 31,744
    new tokens for the suite, 4 samples and 16K for MATH-500). ``temperature=0`` is greedy."""

    n_samples: int = 2
    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    seed: int = 1234
    max_new_tokens: int = 256
    batch_size: int = 16  # sequences decoded together (problems x samples)
    system_prompt: str | None = None
    enable_thinking: bool | None = None  # passed to chat templates that understand it (Qwen3)
    save_token_ids: bool = False  # store generated token ids in every result row (large at paper scale)


@dataclass
class GradingConfig:
    """Grader: exact last-``\\boxed{}`` match, then math-verify in worker processes.

    ``timeout_s``: wall time per sample; a worker that exceeds it is killed and replaced and the sample
    counts as incorrect. ``start_method``: ``forkserver`` (workers forked from a server that has
    math-verify imported) or ``spawn``. ``strip_reasoning``: grade only the text after the last
    closed reasoning block (``</think>``, ``<|end_of_thought|>``); the record keeps the full text.
    ``max_error_rate``: the run fails (after writing its rows and metrics) when more than this share of
    the samples graded in it could not be graded (math-verify raised or its worker died); a rerun
    grades those rows again without generating them. Timeouts are a grade (incorrect), not an error.
    """

    workers: int = 2
    timeout_s: float = 10.0
    start_method: str = "forkserver"
    strip_reasoning: bool = False
    math_verify: bool = True
    max_error_rate: float = 0.01


SCHEMAS = [
    ("benchmark", "benchmark", BenchmarkConfig),
    ("eval", "generation", GenerationConfig),
    ("eval", "grading", GradingConfig),
]
