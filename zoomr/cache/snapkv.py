"""SnapKV (Li et al., NeurIPS 2024, §4; FasterDecoding/SnapKV ``snapkv_utils.py``), prefill only.

At the end of the prefill, the last ``window`` prompt queries (post-RoPE) vote: their softmax attention
(causal inside the window) over the older prompt rows is averaged over the window, pooled along the
sequence (``avgpool`` or ``maxpool``, ``kernel``, zero padding as the reference's ``avg_pool1d``), and for GQA
averaged over the group's query heads (as kvpress does; the original code is multi-head). Each KV head keeps
its top ``budget_rows - window`` older rows plus the window; a prompt shorter than the budget is kept whole.
With ``compression_ratio`` the budget is each prompt's own ``int(n * (1 - ratio))`` rows (kvpress's
``SnapKVPress``), for runs at the compression another arm achieved.
Decoding then appends every new row (SnapKV does not evict during decoding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from zoomr.cache.base import PolicyCache, PolicyLayer
from zoomr.cache.config import PolicyConfig, check_positive, check_ratio
from zoomr.cache.queries import push_queries, select_queries
from zoomr.cache.ratio import kept_at_ratio
from zoomr.cache.registry import register_policy


def snapkv_scores(
    keys: torch.Tensor, n: torch.Tensor, queries: torch.Tensor, window: int, kernel: int, pooling: str
) -> torch.Tensor:
    """Scores ``[B, H_kv, N]`` of the older rows ``j < n - window`` (``-inf`` elsewhere).

    ``keys [B, H_kv, N, d]`` (row j valid iff j < n[b, h]), ``queries [B, H_q, window, d]``: the queries of
    the last ``window`` rows, in order.
    """
    B, Hkv, N, d = keys.shape
    Hq = queries.shape[1]
    g = Hq // Hkv
    logits = (
        torch.einsum("bhgwd,bhnd->bhgwn", queries.view(B, Hkv, g, window, d).float(), keys.float()) / d**0.5
    )
    j = torch.arange(N, device=keys.device)
    i = torch.arange(window, device=keys.device)
    visible = j[None, None, None, :] <= (n[:, :, None, None] - window + i[None, None, :, None])  # causal
    logits = logits.masked_fill(~visible[:, :, None], float("-inf"))
    attn = torch.softmax(logits, dim=-1).mean(dim=-2)  # [B, Hkv, g, N]
    older = j[None, None, :] < (n - window)[:, :, None]  # [B, Hkv, N]
    attn = attn * older[:, :, None]
    flat = attn.reshape(B * Hkv * g, 1, N)
    if pooling == "avgpool":
        pooled = F.avg_pool1d(flat, kernel, stride=1, padding=kernel // 2)
    else:
        pooled = F.max_pool1d(flat, kernel, stride=1, padding=kernel // 2)
    scores = pooled.view(B, Hkv, g, N).mean(dim=2)
    return scores.masked_fill(~older, float("-inf"))


def top_plus_window(
    scores: torch.Tensor, n: torch.Tensor, budget: int | torch.Tensor, window: int
) -> torch.Tensor:
    """``[B, H, N]`` keep mask: top ``budget - window`` rows by ``scores`` + the last ``window`` rows;
    a (b, h) with at most ``budget`` rows keeps everything. ``budget``: one number or one per ``[B, H]``."""
    N = scores.shape[-1]
    j = torch.arange(N, device=scores.device)[None, None, :]
    held = j < n[:, :, None]
    keep = held & (j >= (n - window)[:, :, None])
    budget = torch.as_tensor(budget, device=n.device).expand_as(n)
    k = (budget - window).clamp(0, N)  # [B, H] older rows to keep
    k_max = int(k.max()) if k.numel() else 0
    if k_max > 0:
        top = torch.topk(scores, k_max, dim=-1).indices  # best first
        take = torch.arange(k_max, device=scores.device)[None, None, :] < k[:, :, None].to(scores.device)
        keep |= torch.zeros_like(keep).scatter_(-1, top, take) & held & torch.isfinite(scores)
    return torch.where((n <= budget)[:, :, None], held, keep)


@dataclass
class SnapKVConfig(PolicyConfig):
    """SnapKV (Li et al. 2024), prefill only: the last ``window`` prompt queries vote (attention summed over the
    window, averaged over a GQA group, pooled with ``kernel``); keep the top ``budget_rows - window`` + window."""

    budget_rows: int | None = 1024
    window: int = 32
    kernel: int = 5
    pooling: str = "avgpool"
    compression_ratio: float | None = None  # each prompt keeps int(n * (1 - ratio)) rows (budget_rows=None)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive("SnapKVConfig", window=self.window, kernel=self.kernel)
        if self.compression_ratio is not None:
            check_ratio("SnapKVConfig", self.compression_ratio, self.budget_rows)
        elif self.budget_rows is None or self.budget_rows < self.window:
            raise ValueError(
                f"SnapKVConfig: need budget_rows >= window, got {self.budget_rows} < {self.window}"
            )
        if self.kernel % 2 == 0:
            raise ValueError(f"SnapKVConfig: kernel must be odd (centred pooling), got {self.kernel}")
        if self.pooling not in ("avgpool", "maxpool"):
            raise ValueError(f"SnapKVConfig: pooling must be avgpool or maxpool, got {self.pooling!r}")


@register_policy("snapkv", SnapKVConfig)
class SnapKVCache(PolicyCache):
    def on_queries(self, layer: PolicyLayer, query: torch.Tensor) -> None:
        if self.step.is_prefill:
            s = layer.state
            s["q"], s["qv"] = push_queries(
                s.get("q"), s.get("qv"), query, self.step.valid, self.config.window
            )

    def after_attention(self, layer: PolicyLayer) -> None:
        if not self.step.ends_prefill:
            return
        queries = layer.state.pop("q", None)
        layer.state.pop("qv", None)
        store, cfg = layer.store, self.config
        if cfg.compression_ratio is not None:  # each prompt pruned to its own share (kvpress's ratio)
            budget = kept_at_ratio(store.n, cfg.compression_ratio, minimum=cfg.window)
        else:
            budget = torch.full_like(store.n, cfg.budget_rows)
        if queries is None or bool((store.n <= budget).all()):
            return
        with self.selecting():
            rows = store.rows()
            scores = snapkv_scores(
                rows.keys, rows.n, queries.to(rows.keys.device), cfg.window, cfg.kernel, cfg.pooling
            )
            self.evict(layer.idx, top_plus_window(scores, rows.n, budget.to(rows.n.device), cfg.window))

    def on_select_batch(self, index: torch.Tensor) -> None:
        for layer in self.layers:
            if "q" in layer.state:
                layer.state["q"], layer.state["qv"] = select_queries(
                    layer.state["q"], layer.state["qv"], index
                )
