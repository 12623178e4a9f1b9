"""``python -m data_prep +pipeline=<name>``: the data-preparation entry point.

The chosen pipeline's config names its module (``pipeline.module`` → ``data_prep.<module>``), whose
``run(cfg)`` turns the config into plain objects and does the work.
"""

from __future__ import annotations

if __name__ == "__main__":  # before the imports below: Ctrl-C while they run prints one line, not a traceback
    from zoomr.startup import quiet_while_starting

    quiet_while_starting()

import importlib  # noqa: E402

from zoomr.entry import hydra_entry, require_group, select, setup_logging  # noqa: E402


# both pipelines resume into pipeline.out_dir: summaries kept in their store, complete pair shards kept
@hydra_entry("data_prep", resumes_from=lambda cfg: select(cfg, "pipeline.out_dir"))
def main(cfg) -> None:
    setup_logging()
    require_group(cfg, "pipeline", "data_prep")
    module = cfg.pipeline.get("module")
    if not module:
        raise SystemExit(f"pipeline {cfg.pipeline.get('name')!r} names no module (pipeline.module)")
    importlib.import_module(f"data_prep.{module}").run(cfg)


if __name__ == "__main__":
    main()
