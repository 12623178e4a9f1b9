"""``python -m analysis +task=<name>``: run one analysis (benchmarks, tables, figures) from conf/task/.

Every analysis is a module ``analysis/<module>.py`` with its own command line (``python -m analysis.<module>
--help``); a task config names the module and its arguments, so sweeps and SLURM launchers work for them too.
A module with typed task fields (e.g. ``paper_tables``: ``task.runs``, ``task.out``) defines
``run_task(task: dict, logger: dict)`` and gets the resolved task and logger configs instead of argv.
"""

from __future__ import annotations

if __name__ == "__main__":  # before the imports below: Ctrl-C while they run prints one line, not a traceback
    from zoomr.startup import quiet_while_starting

    quiet_while_starting()

import importlib  # noqa: E402
import sys  # noqa: E402

from zoomr.entry import hydra_entry, require_group, select, setup_logging  # noqa: E402

RESUMABLE_TASKS = ("miniature",)  # modules whose rerun does only what is missing in task.out
WANDB_TASKS = ("paper_tables",)  # modules that log to W&B under the logger config; the others write files only


def resumes_from(cfg) -> str | None:
    """Where a rerun continues from after Ctrl-C: the miniature's ``task.out``; other analyses start over."""
    return select(cfg, "task.out") if select(cfg, "task.module") in RESUMABLE_TASKS else None


def check_logger(cfg) -> None:
    """``logger=wandb`` on a task that logs nothing to W&B is refused before it runs: the task ran, wrote its files
    and ended without a W&B run or a word about it."""
    from zoomr.schemas.checks import SettingsError
    from zoomr.tracking import resolve_mode

    module, mode = select(cfg, "task.module"), select(cfg, "logger.mode")
    if module is None or module in WANDB_TASKS or mode is None or resolve_mode(mode) == "disabled":
        return
    if module == "bench_throughput":
        hint = "it logs with its own flag: task.args='[--logger,wandb]' logger=none"
    elif module.startswith("bench_"):
        hint = "run it with logger=none, then log the JSON it writes: python -m analysis.log_bench <file>"
    else:
        hint = "run it with logger=none"
    raise SettingsError(
        f"logger={select(cfg, 'logger.name')}: the analysis task {select(cfg, 'task.name')!r} logs nothing to W&B "
        f"(only {', '.join(WANDB_TASKS)} does); {hint}"
    )


@hydra_entry("analysis", resumes_from=resumes_from, settings=check_logger)
def main(cfg) -> None:
    setup_logging()
    require_group(cfg, "task", "analysis")
    check_logger(cfg)
    module = importlib.import_module(f"analysis.{cfg.task.module}")
    if hasattr(module, "run_task"):
        from zoomr.entry import to_plain

        module.run_task(to_plain(cfg.task), to_plain(cfg.logger))
        return
    sys.argv = [f"analysis.{cfg.task.module}", *cfg.task.args]
    module.main()


if __name__ == "__main__":
    main()
