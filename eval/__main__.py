"""``python -m eval [+method=<policy>] [benchmark=<name>] [model=<name>]``: the evaluation entry point.

Turns the config into plain objects (problems, model, cache policy, grader) and runs
:func:`eval.runner.evaluate` into ``run_dir`` (derived from benchmark/model/run_name, so the same
command resumes). Writes ``results.jsonl``, ``metrics.json``, ``summary.json``; W&B summary + tables.
"""

from __future__ import annotations

if __name__ == "__main__":  # before the imports below: Ctrl-C while they run prints one line, not a traceback
    from zoomr.startup import quiet_while_starting

    quiet_while_starting()

import logging  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from zoomr.entry import hydra_entry, model_spec, pick_device, setup_logging, start_run, to_plain  # noqa: E402

log = logging.getLogger("eval")


def fingerprint(cfg: Any) -> dict[str, Any]:
    """What decides the content of a result row; n_samples / problem_limit / batching / workers only
    choose which rows exist or how fast, so a run may be extended or resumed with other values."""
    from eval.steps import fingerprint as steps_fingerprint

    plain = to_plain(cfg)
    return steps_fingerprint(plain["model"], plain.get("method"), plain["benchmark"], plain["generation"], plain["grading"])


def check_policy(method: Any | None, model: Any, tokenizer: Any, asked: set[str] = frozenset()) -> Any | None:
    """Build the ``+method=`` cache policy once on the loaded model (None: full KV): a setting that only
    the model can reject (e.g. a budget its layers cannot hold) fails here, before any state is written; so does
    a field given on the command line (``asked``) that the policy would serve with another value (AbridgeKV's
    layout, replaced by its checkpoint's ``abridge.json``). No method (full KV) is built too: a model no policy can
    run (sliding-window layers) is refused here, not at the first batch after config.json was written."""
    from zoomr.cache import build_policy

    try:
        ignored = build_policy(method or {"policy": "full"}, model.config, tokenizer).ignored_settings(set(asked))
    except (ValueError, TypeError, KeyError) as e:
        raise SystemExit(f"invalid eval settings (nothing was written):\n  method: {e}") from None
    if ignored:
        raise SystemExit(
            "invalid eval settings (nothing was written):\n  " + "\n  ".join(ignored) + "\n  the checkpoint's "
            "own layout is what it was trained for and what it serves: leave these unset, or set "
            "method.layout_from_checkpoint=false to serve the fields given"
        )
    return method


def method_overrides() -> set[str]:
    """The ``method.<field>`` keys given on this run's command line (Hydra's task overrides)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return set()
    keys = (o.split("=", 1)[0].lstrip("+~") for o in HydraConfig.get().overrides.task)
    return {k.removeprefix("method.") for k in keys if k.startswith("method.")}


def run(cfg: Any) -> dict[str, Any]:
    from eval.budget import resolve_budget
    from eval.grading import GraderBroken
    from eval.results import check_fingerprint
    from eval.settings import validate
    from eval.steps import check_positions, decode_and_grade, load_problems
    from eval.tasks import get_task
    from zoomr.cache import match_budget
    from zoomr.models import load_config, load_model, load_tokenizer
    from zoomr.runlock import RunLock

    # everything that can reject the settings runs before the lock, the fingerprint and config.json
    settings = validate(cfg)
    budget = resolve_budget(cfg, settings.method)  # a relative budget becomes budget_rows before the fingerprint
    bench, gen, grading = settings.bench, settings.gen, settings.grading
    task = get_task(bench.task)  # problems, prompt, script, grading and metrics of the benchmark (eval/tasks.py)
    spec = model_spec(cfg)
    tokenizer = load_tokenizer(spec, cfg.cache_dir)  # before the problems: RULER counts the model's tokens
    try:
        if task.prompt_bound is not None:  # RULER's / LongBench's prompt length past the model's positions: refused first
            check_positions(task, bench, load_config(spec, cfg.cache_dir))
        problems = load_problems(task, bench, tokenizer, gen)
        task.check_model(bench, spec.hf_id)
    except (ValueError, FileNotFoundError, RuntimeError) as e:
        raise SystemExit(f"benchmark {bench.name!r}: {e}") from None
    device = pick_device(cfg.device)
    model = load_model(spec, cfg.cache_dir, device=device)
    method = match_budget(settings.method, cfg.method.budget_rows) if budget else settings.method  # typed once
    check_policy(method, model, tokenizer, method_overrides())
    try:
        task.check_policy(problems, method)
    except ValueError as e:
        name = getattr(method, "name", None)
        raise SystemExit(f"benchmark {bench.name!r} with +method={name}: {e} (nothing was written)") from None
    with RunLock(cfg.run_dir):
        check_fingerprint(cfg.run_dir, fingerprint(cfg))  # before start_run rewrites config.json
        run_dir, logger = start_run(cfg, job_type="eval", same_run=True)  # a rerun resumes rows and W&B run
        log.info(
            "%s: %d problems x %d samples, %s on %s, method %s -> %s",
            bench.name, len(problems), gen.n_samples, spec.name, device, cfg.run_name, run_dir,
        )  # fmt: skip
        try:
            rows, counts = decode_and_grade(task, problems, model, tokenizer, method, gen, grading, run_dir, bench.name)
        except GraderBroken as e:
            raise SystemExit(f"{run_dir}: grading failed, finished rows are kept: {e}") from None
        return _finish(cfg, run_dir, logger, task, bench, spec, rows, counts, grading.max_error_rate, budget)


def _finish(cfg, run_dir, logger, task, bench, spec, rows, counts, max_error_rate, budget) -> dict[str, Any]:
    """Metrics, summary, console table and tracker; fails the run when grading failed too often."""
    from eval.steps import run_metrics
    from eval.summary import console_table
    from zoomr.rundir import write_json

    metrics = run_metrics(task, rows, counts, max_error_rate, to_plain(cfg.method) if cfg.get("method") else None, budget)
    grading_this_run = metrics["grading_this_run"]
    write_json(Path(run_dir) / "metrics.json", metrics)  # a kill leaves the old file or the new one
    pooled = metrics["pooled"]
    summary = {
        "benchmark": bench.name,
        "model": spec.name,
        "method": cfg.run_name,
        **{k: v for k, v in pooled.items() if isinstance(v, int | float | str)},
        **{k: v for k, v in metrics["eviction"].items() if k != "samples"},
        "run_dir": str(run_dir),
    }
    write_json(Path(run_dir) / "summary.json", summary)
    table = task.report(metrics, console_table(metrics))
    print(
        f"\n== eval {bench.name} | {spec.name} | {cfg.run_name} ==\n{table}\nresults: {run_dir}", flush=True
    )
    log_summary(logger, task.name, metrics)
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


def log_summary(logger: Any, task: str, metrics: dict[str, Any]) -> None:
    """The run's numbers into the tracker's summary (``eval/<metric>``): the pooled metrics, accuracy per
    competition, and the task's own metrics (the testbed's recall by distance, RULER's and LongBench's subset
    scores: ``eval/testbed/recall_all``, ``eval/ruler/subsets/niah_single_1/score``), which only the console showed,
    and ``eval/evicted_samples`` (summary.json's: 0 for a compressing arm that never evicted, which W&B showed as
    a compressed arm with full KV's accuracy)."""
    from zoomr.rundir import flatten

    logger.summary({k: v for k, v in metrics["pooled"].items() if isinstance(v, int | float)})
    eviction = metrics.get("eviction") or {}
    if "evicted_samples" in eviction:
        logger.summary({"evicted_samples": eviction["evicted_samples"]})
    logger.summary({f"acc/{name}": m["accuracy"] for name, m in metrics["by_competition"].items()})
    own = metrics.get(task) if task else None
    if isinstance(own, dict):
        logger.summary({
            f"{task}/{k.replace('.', '/')}": v
            for k, v in flatten(own).items() if isinstance(v, int | float) and not isinstance(v, bool)
        })  # fmt: skip


def check_settings(cfg: Any) -> None:
    """What :func:`run` checks before it loads anything (a ``--multirun`` checks every job with it first)."""
    from eval.settings import validate

    validate(cfg)


@hydra_entry("eval", resumes_from=lambda cfg: cfg.run_dir,  # finished samples are appended and skipped on a rerun
             settings=check_settings)  # fmt: skip
def main(cfg) -> None:
    setup_logging()
    run(cfg)


if __name__ == "__main__":
    main()
