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


def resumes_from(cfg) -> str | None:
    """Where a rerun continues from after Ctrl-C: the miniature's ``task.out``; other analyses start over."""
    return select(cfg, "task.out") if select(cfg, "task.module") in RESUMABLE_TASKS else None


@hydra_entry("analysis", resumes_from=resumes_from)
def main(cfg) -> None:
    setup_logging()
    require_group(cfg, "task", "analysis")
    module = importlib.import_module(f"analysis.{cfg.task.module}")
    if hasattr(module, "run_task"):
        from zoomr.entry import to_plain

        module.run_task(to_plain(cfg.task), to_plain(cfg.logger))
        return
    sys.argv = [f"analysis.{cfg.task.module}", *cfg.task.args]
    module.main()


if __name__ == "__main__":
    main()
