"""End-of-run summary shared by every trainer: printed table + summary.json in the run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zoomr.rundir import SUMMARY_FILE, RunPlan, format_block, write_json


def loss_curve(log_history: list[dict[str, Any]], key: str = "loss") -> list[tuple[int, float]]:
    return [(int(h["step"]), float(h[key])) for h in log_history if key in h and "step" in h]


def training_losses(trainer) -> dict[str, Any]:
    """Steps, first and last logged loss, and the whole-run mean loss (across resumes) of a finished Trainer."""
    from zoomr.training import whole_run_loss

    history = trainer.state.log_history
    curve = loss_curve(history)
    return {
        "steps": trainer.state.global_step,
        "loss_start": curve[0][1] if curve else float("nan"),
        "loss_end": curve[-1][1] if curve else float("nan"),
        "train_loss": whole_run_loss(history),  # the whole run, across resumes
    }


def write_summary(run: RunPlan | Path, summary: dict[str, Any], title: str) -> str:
    """Write ``summary.json`` atomically (through the run's plan, which also records that the run finished,
    when given one) and print and return a readable block."""
    if isinstance(run, RunPlan):
        run.finish(summary)
    else:
        write_json(Path(run) / SUMMARY_FILE, summary)
    text = format_block(summary, title)
    print(text, flush=True)
    return text


def finish_run(plan, logger, summary: dict[str, Any], title: str) -> dict[str, Any]:
    """Write and print the summary (recording through the run plan that the run finished), log its numbers."""
    write_summary(plan, summary, title)
    logger.summary({k: v for k, v in summary.items() if isinstance(v, int | float)})
    logger.finish()
    return summary
