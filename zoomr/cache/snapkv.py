"""SnapKV (Li et al., NeurIPS 2024, §4; FasterDecoding/SnapKV ``snapkv_utils.py``), prefill only.

At the end of the prefill, the last ``window`` prompt queries (post-RoPE) vote: their softmax attention
(causal inside the window) over the older prompt rows is averaged over the window, pooled along the
sequence (``avgpool`` or ``maxpool``, ``kernel``, zero padding as the reference's ``avg_pool1d``), and for GQA
averaged over the group's query heads (as kvpress does; the original code is multi-head). Each KV head keeps
its top ``budget_rows - window`` older rows plus the window; a prompt shorter than the budget is kept whole.
Decoding then appends every new row (SnapKV does not evict during decoding).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from zoomr.cache.base import PolicyCache, PolicyLayer
from zoomr.cache.queries import push_queries, select_queries
from zoomr.cache.registry import register_policy
from zoomr.schemas.cache import SnapKVConfig


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


def top_plus_window(scores: torch.Tensor, n: torch.Tensor, budget: int, window: int) -> torch.Tensor:
    """``[B, H, N]`` keep mask: top ``budget - window`` rows by ``scores`` + the last ``window`` rows;
    a (b, h) with at most ``budget`` rows keeps everything."""
    N = scores.shape[-1]
    j = torch.arange(N, device=scores.device)[None, None, :]
    held = j < n[:, :, None]
    keep = held & (j >= (n - window)[:, :, None])
    k = min(budget - window, N)
    if k > 0:
        top = torch.topk(scores, k, dim=-1).indices
        keep |= torch.zeros_like(keep).scatter_(-1, top, True) & held & torch.isfinite(scores)
    return torch.where((n <= budget)[:, :, None], held, keep)


@register_policy("snapkv", config=SnapKVConfig)
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
        if queries is None or int(store.n.max()) <= cfg.budget_rows:
            return
        with self.selecting():
            rows = store.rows()
            scores = snapkv_scores(
                rows.keys, rows.n, queries.to(rows.keys.device), cfg.window, cfg.kernel, cfg.pooling
            )
            self.evict(layer.idx, top_plus_window(scores, rows.n, cfg.budget_rows, cfg.window))

    def on_select_batch(self, index: torch.Tensor) -> None:
        for layer in self.layers:
            if "q" in layer.state:
                layer.state["q"], layer.state["qv"] = select_queries(
                    layer.state["q"], layer.state["qv"], index
                )
