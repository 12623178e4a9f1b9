"""One validation pass over an eval run's settings, before anything is written (issue 18, defect 3).

:func:`validate` checks sampling (the engine's own :class:`zoomr.engine.DecodeSettings` rules),
batching, the grader, the benchmark and the cache policy's hyperparameters, reports every problem at
once and exits with that message; only then does ``python -m eval`` take the run's lock, write its
fingerprint and config. A corrected rerun is therefore never refused because of a bad earlier one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from zoomr.schemas import to_dataclass
from zoomr.schemas.eval import BenchmarkConfig, GenerationConfig, GradingConfig

log = logging.getLogger(__name__)


@dataclass
class EvalSettings:
    """The checked settings as plain objects (``method``: the ``+method=`` policy's config dataclass, typed
    here once for the whole run; None = full KV)."""

    bench: BenchmarkConfig
    gen: GenerationConfig
    grading: GradingConfig
    method: Any | None


def _generation_problems(gen: GenerationConfig) -> list[str]:
    from zoomr.engine import DecodeSettings

    out = []
    try:
        DecodeSettings(gen.max_new_tokens, gen.temperature, gen.top_p, gen.top_k, gen.seed, progress=False)
    except ValueError as e:
        out.append(f"generation: {e}")
    for name in ("n_samples", "batch_size"):
        if getattr(gen, name) < 1:
            out.append(f"generation.{name} must be >= 1, got {getattr(gen, name)}")
    return out


def _benchmark_problems(bench: BenchmarkConfig) -> list[str]:
    out = []
    if bench.problem_limit is not None and bench.problem_limit < 1:
        out.append(
            f"benchmark.problem_limit must be >= 1 (or null for every problem), got {bench.problem_limit}"
        )
    from eval.tasks import TASKS, get_task

    if bench.task not in TASKS:
        out.append(f"benchmark.task must be one of {'|'.join(TASKS)}, got {bench.task!r}")
    elif bench.length is not None and not get_task(bench.task).takes_length:  # was ignored without a word
        out.append(f"benchmark.length={bench.length}: benchmark {bench.name!r} does not generate its problems to a "
                   "length (its prompts would not change); leave benchmark.length unset")  # fmt: skip
    if bench.source not in ("local", "hub"):
        out.append(f"benchmark.source must be local|hub, got {bench.source!r}")
    if not bench.sources:
        out.append("benchmark.sources is empty")
    if twice := sorted({s for s in bench.sources if bench.sources.count(s) > 1}):
        out.append(f"benchmark.sources lists {twice} more than once (its problems would be decoded and counted twice)")
    return out


def _attention_problems(model: Any) -> list[str]:
    """``model.attn_implementation`` other than sdpa: eval decodes every batch through the cache policies' attention
    (SDPA, eager where a policy reads the weights), so eager, flex_attention or flash_attention_2 were not used, while
    config.json and the fingerprint said they were (flash_attention_2 without its package: an ImportError traceback)."""
    from zoomr.cache.base import POLICY_ATTENTION

    attn = model.get("attn_implementation") if model is not None else None
    if attn in (None, "sdpa"):
        return []
    return [f"model.attn_implementation={attn} would be ignored: eval decodes through {POLICY_ATTENTION}, which "
            "computes with SDPA (eagerly where a policy reads the attention weights); leave it at sdpa"]  # fmt: skip


def _method(method: dict[str, Any] | None) -> tuple[Any | None, list[str]]:
    """The policy config dataclass of the ``+method=`` node (None without one), and its problems."""
    if method is None:
        return None, []
    if not method.get("policy"):
        return None, [
            f"method {method.get('name')!r} is not a cache policy (no 'policy' field): evaluate a trained "
            "model with model.hf_id=<checkpoint> and the policy it was trained for"
        ]
    from zoomr.cache.registry import policy_config

    try:
        return policy_config(method), []
    except (ValueError, TypeError, KeyError) as e:
        return None, [f"method: {e}"]


def validate(cfg: Any) -> EvalSettings:
    """Every setting of ``python -m eval`` checked at once; ``SystemExit`` listing all problems."""
    from eval.grading import check_grading_settings
    from zoomr.entry import to_plain

    problems: list[str] = []
    parsed: dict[str, Any] = {}
    for key, cls in (("benchmark", BenchmarkConfig), ("generation", GenerationConfig), ("grading", GradingConfig)):
        try:
            parsed[key] = to_dataclass(cls, cfg[key])
        except (ValueError, TypeError) as e:
            problems.append(f"{key}: {e}")
    if "generation" in parsed:
        problems += _generation_problems(parsed["generation"])
    if "benchmark" in parsed:
        problems += _benchmark_problems(parsed["benchmark"])
    if "grading" in parsed:
        g = parsed["grading"]
        try:
            check_grading_settings(g.workers, g.timeout_s, g.start_method, g.max_error_rate)
        except ValueError as e:
            problems.append(str(e))
    method, method_problems = _method(to_plain(cfg.method) if cfg.get("method") is not None else None)
    problems += method_problems
    problems += _attention_problems(cfg.get("model"))
    if problems:
        raise SystemExit("invalid eval settings (nothing was written):\n  " + "\n  ".join(problems))
    gen = parsed["generation"]
    if gen.temperature == 0 and gen.n_samples > 1:  # allowed (a paired design may want it), but never useful
        log.warning("generation.temperature=0 with generation.n_samples=%d: greedy samples are identical, so pass@k "
                    "is greedy accuracy and %d of every %d decodes are spent for nothing; set generation.n_samples=1",
                    gen.n_samples, gen.n_samples - 1, gen.n_samples)  # fmt: skip
    return EvalSettings(parsed["benchmark"], parsed["generation"], parsed["grading"], method)
