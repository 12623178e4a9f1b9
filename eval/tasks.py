"""Task plugins: benchmarks that bring their own problems, prompts, scores and metrics (RULER, LongBench).

A plugin is looked up by ``benchmark.task`` (:func:`task_plugin`; None for the built-in math / gpqa /
testbed tasks). The evaluator then

- builds the problems with ``plugin.load(bench, tokenizer, gen)`` (RULER counts lengths in the model's
  tokens, so it needs the tokenizer); each problem carries its rendered prompt in ``meta["prompt"]``,
  its gold strings in ``meta["answers"]`` and its generation budget in ``meta["max_new_tokens"]``;
- scores each sample with ``plugin.score(problem, text)`` in [0, 1] on the output cut to the problem's
  budget (greedy decoding to a larger cap and cutting is the same as decoding to the budget, so one run
  serves subsets with different budgets), writing ``score`` into every row (``correct`` = score 1.0);
- aggregates per subset (``competition``) and averaged with ``plugin.summarize`` into
  ``metrics.json[<task>]``, next to each subset's mean achieved compression (fraction of KV pairs
  removed, from the rows' ``kv.compression`` / ``kv.prefill_compression``; kvpress's definition).
"""

from __future__ import annotations

import importlib
import json
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eval.benchmarks import Problem
from eval.generation import Generation
from eval.grading import Grade

log = logging.getLogger(__name__)

SCOPE_FILE = "problems.json"  # a plugin run's problem ids (its scope), written before decoding

# task -> module defining ``PLUGIN`` (imported on first use)
PLUGINS = {"ruler": "eval.ruler", "longbench": "eval.longbench"}


@dataclass(frozen=True)
class TaskPlugin:
    """``load(bench, tokenizer, gen) -> problems``; ``score(problem, text) -> [0, 1]``;
    ``summarize(subset scores in %) -> averages`` (e.g. LongBench's with and without TREC)."""

    name: str
    load: Callable[[Any, Any, Any], list[Problem]]
    score: Callable[[Problem, str], float]
    summarize: Callable[[dict[str, float]], dict[str, float]]


def task_plugin(task: str) -> TaskPlugin | None:
    """The plugin of ``task``, or None for the evaluator's built-in tasks."""
    if task not in PLUGINS:
        return None
    return importlib.import_module(PLUGINS[task]).PLUGIN


def write_scope(run_dir: str | Path, problems: list[Problem]) -> None:
    """Record the run's problem ids: generated / hub problems cannot be listed again without the model's
    tokenizer or the hub, so :func:`eval.compare.load_run` reads the scope from here."""
    (Path(run_dir) / SCOPE_FILE).write_text(json.dumps([p.id for p in problems]))


def read_scope(run_dir: str | Path) -> list[str]:
    path = Path(run_dir) / SCOPE_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"{run_dir}: no {SCOPE_FILE} (a RULER / LongBench run writes it when it starts)"
        )
    return json.loads(path.read_text())


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


def check_budget(problems: list[Problem], max_new_tokens: int) -> None:
    """Warn when the generation cap is below a problem's budget (its output is then cut shorter)."""
    need = max((p.meta["max_new_tokens"] for p in problems), default=0)
    if max_new_tokens < need:
        log.warning(
            "generation.max_new_tokens=%d is below the largest task budget (%d tokens): outputs are scored "
            "as generated; set generation.max_new_tokens=%d for the benchmark's budgets",
            max_new_tokens, need, need,
        )  # fmt: skip


def hooks(plugin: TaskPlugin, tokenizer: Any) -> dict[str, Any]:
    """``grade`` and ``details`` hooks of :func:`eval.runner.evaluate` for a plugin task."""

    def scored(problem: Problem, generation: Generation) -> tuple[str, float]:
        text = scored_text(generation, problem.meta["max_new_tokens"], tokenizer)
        return text, plugin.score(problem, text)

    def details(problem: Problem, generation: Generation) -> dict[str, Any]:
        _, s = scored(problem, generation)
        return {"score": s, "scored_tokens": min(problem.meta["max_new_tokens"], generation.n_tokens)}

    def grade(problem: Problem, generation: Generation) -> Grade:
        text, s = scored(problem, generation)
        return Grade(text.strip()[:200], s >= 1.0, plugin.name)

    return {"grade": grade, "details": details}


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def subset_metrics(plugin: TaskPlugin, rows: list[dict[str, Any]]) -> dict[str, Any]:
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
        **plugin.summarize(scores),
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
