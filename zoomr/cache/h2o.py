"""H2O: heavy-hitter oracle (Zhang et al., NeurIPS 2023, §4; FMInference/H2O ``utils_real_drop/modify_llama.py``).

Every cached row accumulates the post-softmax attention it receives from every query — prefill queries
included — summed over the query heads of its GQA group. After each layer's attention, when a (sequence,
KV head) holds more than ``budget_rows`` rows, keep the ``recent`` newest rows plus the ``budget - recent``
rows with the highest accumulated score among the older ones; evicted rows never return. As in the
reference, the current step's attention is added before selecting, so the new token is scored too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zoomr.cache.base import PolicyCache, PolicyLayer
from zoomr.cache.config import PolicyConfig
from zoomr.cache.registry import register_policy


def heavy_recent_keep(scores: torch.Tensor, n: torch.Tensor, heavy: int, recent: int) -> torch.Tensor:
    """``[B, H, N]`` bool: the last ``recent`` rows and the top-``heavy`` older rows by ``scores`` per (b, h).

    A (b, h) holding at most ``heavy + recent`` rows keeps all of them.
    """
    N = scores.shape[-1]
    j = torch.arange(N, device=scores.device)[None, None, :]
    held = j < n[:, :, None]
    is_recent = held & (j >= n[:, :, None] - recent)
    keep = is_recent.clone()
    if heavy > 0:
        candidates = scores.float().masked_fill(~held | is_recent, float("-inf"))
        top = torch.topk(candidates, min(heavy, N), dim=-1).indices
        chosen = torch.zeros_like(keep).scatter_(-1, top, True) & held & ~is_recent
        keep |= chosen
    return torch.where((n <= heavy + recent)[:, :, None], held, keep)


def group_sum(weights: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """Attention ``[B, H_q, S, N]`` -> received per KV head ``[B, H_kv, N]`` (sum over queries and the group)."""
    B, Hq, S, N = weights.shape
    return weights.view(B, kv_heads, Hq // kv_heads, S, N).sum(dim=(2, 3))


@dataclass
class H2OConfig(PolicyConfig):
    """H2O (Zhang et al. 2023): top ``budget_rows - recent_rows`` rows by accumulated attention + recent rows.

    ``recent_rows`` defaults to half the budget (the paper's equal heavy/recent split).
    """

    name: str = "h2o"
    policy: str = "h2o"
    budget_rows: int | None = 1024
    recent_rows: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.budget_rows is None:
            raise ValueError("H2OConfig: budget_rows is required")
        if self.recent_rows is not None and not 0 <= self.recent_rows <= self.budget_rows:
            raise ValueError(f"H2OConfig: need 0 <= recent_rows <= budget_rows, got {self.recent_rows}")

    @property
    def recent(self) -> int:
        return self.budget_rows // 2 if self.recent_rows is None else self.recent_rows


@register_policy("h2o", H2OConfig)
class H2OCache(PolicyCache):
    row_attrs = ("score",)

    def wants_attention_weights(self, layer: PolicyLayer) -> bool:
        return True

    def on_attention(self, layer: PolicyLayer, weights: torch.Tensor) -> None:
        with self.selecting():
            layer.store.add_to_attr("score", group_sum(weights, self.kv_heads))

    def after_attention(self, layer: PolicyLayer) -> None:
        store = layer.store
        if store.n_max <= self.config.budget_rows:
            return
        with self.selecting():
            recent, heavy = self.config.recent, self.config.budget_rows - self.config.recent
            N = store.n_max
            if heavy > 0 and store.slab and store.n_min == N == heavy + recent + 1:
                # the steady decode step: each (b, h) is one row over the budget, so the top ``heavy`` of the
                # ``heavy + 1`` older rows drop exactly the lowest-scored one (ties: the oldest of them)
                older = store.attrs["score"][:, :, store.start : store.start + N - recent]
                store.drop_rows(older.argmin(dim=-1))
                return
            keep = heavy_recent_keep(store.attr("score"), store.n, heavy, recent)
            self.evict(layer.idx, keep)
