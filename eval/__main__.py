"""``python -m eval [+method=<policy>] [benchmark=<name>] [model=<name>]``: the evaluation entry point.

Turns the config into plain objects (problems, model, cache policy, grader) and runs
:func:`eval.runner.evaluate` into ``run_dir`` (derived from benchmark/model/run_name, so the same
command resumes). Writes ``results.jsonl``, ``metrics.json``, ``summary.json``; W&B summary + tables.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from zoomr.entry import hydra_entry, model_spec, pick_device, setup_logging, start_run, to_plain
from zoomr.schemas.eval import BenchmarkConfig

log = logging.getLogger("eval")


def fingerprint(cfg: Any) -> dict[str, Any]:
    """What decides the content of a result row; n_samples / problem_limit / batching / workers only
    choose which rows exist or how fast, so a run may be extended or resumed with other values."""
    plain = to_plain(cfg)
    gen, bench, grading = plain["generation"], plain["benchmark"], plain["grading"]
    return {
        "model": plain["model"],
        "method": plain.get("method"),
        "benchmark": {k: bench.get(k) for k in ("name", "task", "sources", "option_seed", "options")},
        "generation": {
            k: gen[k]
            for k in (
                "temperature",
                "top_p",
                "top_k",
                "seed",
                "max_new_tokens",
                "system_prompt",
                "enable_thinking",
            )
        },
        "grading": {k: grading[k] for k in ("strip_reasoning", "math_verify")},
    }


def check_policy(method: Any | None, model: Any, tokenizer: Any) -> Any | None:
    """Build the ``+method=`` cache policy once on the loaded model (None: full KV): a setting that only
    the model can reject (e.g. a budget its layers cannot hold) fails here, before any state is written."""
    if method is not None:
        from zoomr.cache import build_policy

        try:
            build_policy(method, model.config, tokenizer)
        except (ValueError, TypeError, KeyError) as e:
            raise SystemExit(f"invalid eval settings (nothing was written):\n  method: {e}") from None
    return method


def testbed_hooks(bench: BenchmarkConfig, tokenizer: Any, problems: list, max_new_tokens: int) -> dict[str, Any]:
    """For ``task=testbed``: the environment's script per problem and per-fact recall in every row."""
    if bench.task != "testbed":
        return {}
    from data_prep.testbed_grading import grade, script_ids

    longest = max(p.meta["record"]["response_tokens"] + 1 for p in problems)
    if max_new_tokens < longest:
        raise SystemExit(
            f"benchmark=testbed: generation.max_new_tokens={max_new_tokens} cuts the traces short; "
            f"the longest needs {longest} (set generation.max_new_tokens={longest} or more)"
        )

    def details(problem, generation) -> dict[str, Any]:
        g = grade(problem.meta["record"], generation.text)
        return {"recall": g["recall"], "recall_accuracy": g["recall_accuracy"]}

    return {"script": lambda p: script_ids(p.meta["record"], tokenizer), "details": details}


def run(cfg: Any) -> dict[str, Any]:
    from eval.benchmarks import load_benchmark
    from eval.budget import resolve_budget
    from eval.generation import engine_generator
    from eval.grading import Grader, GraderBroken
    from eval.prompts import render
    from eval.results import ResultStore, RunLock, check_fingerprint
    from eval.runner import evaluate
    from eval.settings import validate
    from eval.tasks import check_budget, hooks, task_plugin, write_scope
    from zoomr.cache import match_budget
    from zoomr.models import load_model, load_tokenizer

    # everything that can reject the settings runs before the lock, the fingerprint and config.json
    settings = validate(cfg)
    budget = resolve_budget(cfg, settings.method)  # a relative budget becomes budget_rows before the fingerprint
    bench, gen, grading = settings.bench, settings.gen, settings.grading
    plugin = task_plugin(bench.task)  # RULER / LongBench bring problems, prompts and scores (eval/tasks.py)
    spec = model_spec(cfg)
    tokenizer = load_tokenizer(spec, cfg.cache_dir)  # before the problems: RULER counts the model's tokens
    try:
        problems = plugin.load(bench, tokenizer, gen) if plugin else load_benchmark(bench)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        raise SystemExit(f"benchmark {bench.name!r}: {e}") from None
    if plugin:
        check_budget(problems, gen.max_new_tokens)
    device = pick_device(cfg.device)
    model = load_model(spec, cfg.cache_dir, device=device)
    method = match_budget(settings.method, cfg.method.budget_rows) if budget else settings.method  # typed once
    generate = engine_generator(model, tokenizer, check_policy(method, model, tokenizer), gen)
    task_hooks = hooks(plugin, tokenizer) if plugin else testbed_hooks(bench, tokenizer, problems, gen.max_new_tokens)
    prompt = (lambda p: p.meta["prompt"]) if plugin else (lambda p: render(p, tokenizer, gen.system_prompt, gen.enable_thinking))
    with RunLock(cfg.run_dir):
        check_fingerprint(cfg.run_dir, fingerprint(cfg))  # before start_run rewrites config.json
        run_dir, logger = start_run(cfg, job_type="eval")
        if plugin:
            write_scope(run_dir, problems)
        log.info(
            "%s: %d problems x %d samples, %s on %s, method %s -> %s",
            bench.name, len(problems), gen.n_samples, spec.name, device, cfg.run_name, run_dir,
        )  # fmt: skip
        store = ResultStore(run_dir)
        with Grader(
            grading.workers, grading.timeout_s, grading.start_method, grading.math_verify, grading.strip_reasoning
        ) as grader:
            try:
                rows = evaluate(
                    problems,
                    generate,
                    grader,
                    store,
                    prompt,
                    benchmark=bench.name,
                    n_samples=gen.n_samples,
                    batch_size=gen.batch_size,
                    seed=gen.seed,
                    save_token_ids=gen.save_token_ids,
                    **task_hooks,
                )
            except GraderBroken as e:
                raise SystemExit(f"{run_dir}: grading failed, finished rows are kept: {e}") from None
            counts = grader.counts()
        return _finish(cfg, run_dir, logger, bench, spec, rows, counts, grading.max_error_rate, plugin, budget)


def grading_report(counts: dict[str, int], max_error_rate: float) -> dict[str, Any]:
    """``metrics.json["grading_this_run"]``: the grader's counters and the share of samples it failed."""
    failed = counts["errors"] + counts["worker_deaths"]
    rate = failed / counts["graded"] if counts["graded"] else 0.0
    return {**counts, "failed": failed, "failure_rate": rate, "max_error_rate": max_error_rate}


def _finish(cfg, run_dir, logger, bench, spec, rows, counts, max_error_rate, plugin, budget) -> dict[str, Any]:
    """Metrics, summary, console table and tracker; fails the run when grading failed too often."""
    from eval.metrics import compute_metrics
    from eval.summary import console_table, eviction_report
    from eval.tasks import format_subset_table, subset_metrics

    metrics = compute_metrics(rows)
    if bench.task == "testbed":  # per-fact recall by reference distance, pooled over rows
        from data_prep.testbed_grading import summarize

        metrics["testbed"] = {k: v for k, v in summarize(rows).items() if k.startswith("recall")}
    metrics["grading_timeouts_this_run"] = counts["timeouts"]
    grading_this_run = metrics["grading_this_run"] = grading_report(counts, max_error_rate)
    if plugin:  # per-subset scores and achieved compression, averaged
        metrics[plugin.name] = subset_metrics(plugin, rows)
    metrics["eviction"] = eviction_report(rows, to_plain(cfg.method) if cfg.get("method") else None)
    metrics["budget"] = budget
    (Path(run_dir) / "metrics.json").write_text(json.dumps(metrics, indent=2))
    pooled = metrics["pooled"]
    summary = {
        "benchmark": bench.name,
        "model": spec.name,
        "method": cfg.run_name,
        **{k: v for k, v in pooled.items() if isinstance(v, int | float | str)},
        **{k: v for k, v in metrics["eviction"].items() if k != "samples"},
        "run_dir": str(run_dir),
    }
    (Path(run_dir) / "summary.json").write_text(json.dumps(summary, indent=2))
    table = console_table(metrics)
    if plugin:
        table = format_subset_table(plugin.name, metrics[plugin.name]) + "\n" + table
    if "testbed" in metrics:
        table += "\n" + "  ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics["testbed"].items())
    print(
        f"\n== eval {bench.name} | {spec.name} | {cfg.run_name} ==\n{table}\nresults: {run_dir}", flush=True
    )
    logger.summary({k: v for k, v in pooled.items() if isinstance(v, int | float)})
    logger.summary({f"acc/{name}": m["accuracy"] for name, m in metrics["by_competition"].items()})
    logger.table(
        "per_competition",
        ["competition", "problems", "accuracy", "truncation_rate", "mean_tokens"],
        [
            [name, m["problems"], m["accuracy"], m["truncation_rate"], m["mean_tokens"]]
            for name, m in [*metrics["by_competition"].items(), ("pooled", pooled)]
        ],
    )
    logger.finish()
    if grading_this_run["failure_rate"] > max_error_rate:
        raise SystemExit(
            f"{run_dir}: grading failed for {grading_this_run['failed']} of {counts['graded']} samples "
            f"({counts['errors']} math-verify errors, {counts['worker_deaths']} worker deaths, "
            f"{counts['worker_restarts']} restarts) > grading.max_error_rate={max_error_rate}; "
            "the rows are kept and a rerun grades those samples again"
        )
    return metrics


@hydra_entry("eval")
def main(cfg) -> None:
    setup_logging()
    run(cfg)


if __name__ == "__main__":
    main()
