"""Prompt budgets at a compression ratio (kvpress's ``compression_ratio``, the KVzap paper's x-axis).

A prompt of ``n`` rows pruned at ratio ``r`` keeps ``int(n * (1 - r))`` of them (kvpress's
``n_kept = int(q_len * (1 - compression_ratio))``), so a fixed-budget method (SnapKV, StreamingLLM) can be
run at the compression another arm achieved (KVzap's threshold, the KVzip+ oracle) on prompts of any length.
"""

from __future__ import annotations

import torch


def kept_at_ratio(n: torch.Tensor, ratio: float, minimum: int = 0) -> torch.Tensor:
    """Rows kept per entry of ``n`` (rows held, any shape) at ``ratio``; at least ``minimum`` (or ``n``)."""
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"compression_ratio must be in [0, 1), got {ratio}")
    kept = torch.floor(n.double() * (1.0 - ratio)).long()
    return torch.minimum(kept.clamp_min(minimum), n.long())
