"""Supervised fine-tuning recipe (``+method=sft``): TRL SFTTrainer, full or LoRA, assistant-only loss.

The training itself is :func:`zoomr.sft.train_sft` (shared with ``train/zoomr_sft.py``); checkpoints, resume
and DeepSpeed are described there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zoomr.rundir import hf_checkpoint_problems, pick_resume
from zoomr.sft import train_sft


def resolve_resume(resume: str, checkpoint_dir: Path) -> str | None:
    """Only the checkpoint choice of :func:`zoomr.rundir.prepare_run` (newest *complete* one for ``auto``), kept
    for recipes not yet moved to ``prepare_run`` (settings guard, finished runs); new code calls that."""
    return pick_resume(Path(checkpoint_dir), resume, hf_checkpoint_problems)


def run(cfg) -> dict[str, Any]:
    """Entry point of ``python -m train +method=sft``."""
    return train_sft(cfg)
