"""Supervised fine-tuning recipe (``+method=sft``): TRL SFTTrainer, full or LoRA, assistant-only loss.

The training itself is :func:`zoomr.sft.train_sft` (shared with ``train/zoomr_sft.py``); checkpoints, resume
and DeepSpeed are described there.
"""

from __future__ import annotations

from typing import Any

from zoomr.sft import train_sft


def run(cfg) -> dict[str, Any]:
    """Entry point of ``python -m train +method=sft``."""
    return train_sft(cfg)
