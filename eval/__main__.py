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
from zoomr.schemas import to_dataclass
from zoomr.schemas.eval import BenchmarkConfig, GenerationConfig, GradingConfig

log = logging.getLogger("eval")


def fingerprint(cfg: Any) -> dict[str, Any]:
    """What decides the content of a result row; n_samples / problem_limit / batching / workers only
    choose which rows exist or how fast, so a run may be extended or resumed with other values."""
    plain = to_plain(cfg)
    gen, bench, grading = plain["generation"], plain["benchmark"], plain["grading"]
    return {
        "model": plain["model"],
        "method": plain.get("method"),
        "benchmark": {k: bench.get(k) for k in ("name", "task", "sources", "option_seed", "options", "length")},
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


def policy_config(cfg: Any, model: Any, tokenizer: Any) -> dict[str, Any] | None:
    """The ``+method=`` cache-policy config (None: full KV), checked by building it once."""
    if cfg.get("method") is None:
        return None
    method = to_plain(cfg.method)
    if not method.get("policy"):
        raise SystemExit(
            f"method {method.get('name')!r} is not a cache policy (no 'policy' field): "
            "evaluate a trained model with model.hf_id=<checkpoint> and the policy it was trained for"
        )
    from zoomr.cache import build_policy

    build_policy(method, model.config, tokenizer)  # fail on a bad config before any decoding
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
    from eval.grading import Grader
    from eval.metrics import compute_metrics
    from eval.prompts import render
    from eval.results import ResultStore, check_fingerprint
    from eval.runner import evaluate
    from eval.summary import console_table, eviction_report
    from eval.tasks import check_budget, format_subset_table, hooks, subset_metrics, task_plugin
    from zoomr.models import load_model, load_tokenizer

    bench: BenchmarkConfig = to_dataclass(BenchmarkConfig, cfg.benchmark)
    gen: GenerationConfig = to_dataclass(GenerationConfig, cfg.generation)
    grading: GradingConfig = to_dataclass(GradingConfig, cfg.grading)
    plugin = task_plugin(bench.task)  # RULER / LongBench bring problems, prompts and scores (eval/tasks.py)
    spec = model_spec(cfg)
    tokenizer = load_tokenizer(spec, cfg.cache_dir)  # before the problems: RULER counts the model's tokens
    problems = plugin.load(bench, tokenizer, gen) if plugin else load_benchmark(bench)
    budget = resolve_budget(cfg)  # a relative budget (fraction / match) becomes budget_rows before the fingerprint
    check_fingerprint(cfg.run_dir, fingerprint(cfg))  # before start_run rewrites config.json
    run_dir, logger = start_run(cfg, job_type="eval")
    device = pick_device(cfg.device)
    model = load_model(spec, cfg.cache_dir, device=device)
    generate = engine_generator(model, tokenizer, policy_config(cfg, model, tokenizer), gen)
    if plugin:
        check_budget(problems, gen.max_new_tokens)
    log.info(
        "%s: %d problems x %d samples, %s on %s, method %s -> %s",
        bench.name, len(problems), gen.n_samples, spec.name, device, cfg.run_name, run_dir,
    )  # fmt: skip
    store = ResultStore(run_dir)
    with Grader(
        grading.workers, grading.timeout_s, grading.start_method, grading.math_verify, grading.strip_reasoning
    ) as grader:
        rows = evaluate(
            problems,
            generate,
            grader,
            store,
            (lambda p: p.meta["prompt"]) if plugin else (lambda p: render(p, tokenizer, gen.system_prompt, gen.enable_thinking)),
            benchmark=bench.name,
            n_samples=gen.n_samples,
            batch_size=gen.batch_size,
            seed=gen.seed,
            save_token_ids=gen.save_token_ids,
            **(hooks(plugin, tokenizer) if plugin else testbed_hooks(bench, tokenizer, problems, gen.max_new_tokens)),
        )
        timeouts = grader.timeouts
    metrics = compute_metrics(rows)
    if bench.task == "testbed":  # per-fact recall by reference distance, pooled over rows
        from data_prep.testbed_grading import summarize

        metrics["testbed"] = {k: v for k, v in summarize(rows).items() if k.startswith("recall")}
    if plugin:  # per-subset scores and achieved compression, averaged
        metrics[plugin.name] = subset_metrics(plugin, rows)
    metrics["grading_timeouts_this_run"] = timeouts
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
    return metrics


@hydra_entry("eval")
def main(cfg) -> None:
    setup_logging()
    run(cfg)


if __name__ == "__main__":
    main()
