"""``python -m analysis +task=<name>``: run one analysis (benchmarks, tables, figures) from conf/task/.

Every analysis is a module ``analysis/<module>.py`` with its own command line (``python -m analysis.<module>
--help``); a task config names the module and its arguments, so sweeps and SLURM launchers work for them too.
"""

from __future__ import annotations

import importlib
import sys

from zoomr.entry import hydra_entry, require_group, setup_logging


@hydra_entry("analysis")
def main(cfg) -> None:
    setup_logging()
    require_group(cfg, "task", "analysis")
    module = importlib.import_module(f"analysis.{cfg.task.module}")
    sys.argv = [f"analysis.{cfg.task.module}", *cfg.task.args]
    module.main()


if __name__ == "__main__":
    main()
