"""A window of each sequence's most recent post-RoPE queries (SnapKV's observation window, R-KV's ring)."""

from __future__ import annotations

import torch


def push_queries(
    ring: torch.Tensor | None,
    ring_valid: torch.Tensor | None,
    query: torch.Tensor,
    valid: torch.Tensor,
    window: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Append this step's queries ``[B, H_q, S, d]`` (valid ``[B, S]``) and keep the last ``window`` valid ones.

    Returns ``(ring [B, H_q, window, d], ring_valid [B, window])``, oldest first; the valid entries of a
    sequence are its last ones (fewer than ``window`` early on: the first slots are then invalid).
    """
    B, Hq, _, d = query.shape
    if ring is None:
        ring = query.new_zeros(B, Hq, 0, d)
        ring_valid = valid.new_zeros(B, 0)
    cat = torch.cat([ring, query.detach()], dim=2)
    cat_valid = torch.cat([ring_valid, valid.to(ring_valid.device)], dim=1)
    L = cat.shape[2]
    if window >= L:
        pad = window - L
        return (
            torch.cat([cat.new_zeros(B, Hq, pad, d), cat], dim=2),
            torch.cat([cat_valid.new_zeros(B, pad), cat_valid], dim=1),
        )
    rank = cat_valid.long() * torch.arange(1, L + 1, device=cat_valid.device)  # later valid = larger
    idx = torch.topk(rank, window, dim=1).indices.sort(dim=1).values
    return cat.gather(2, idx[:, None, :, None].expand(B, Hq, window, d)), cat_valid.gather(1, idx)


def select_queries(ring: torch.Tensor, ring_valid: torch.Tensor, index: torch.Tensor):
    """Reindex a ring after the batch shrank."""
    index = index.to(ring.device)
    return ring[index], ring_valid[index]
