"""R-KV: redundancy-aware KV compression for reasoning models (Cai et al. 2025, §3; Zefan-Cai/R-KV
``rkv/compression/r1_kv.py``, ``rkv/utils.py``).

Per KV head, with the last ``window`` post-RoPE queries (a ring kept across steps):
- importance: softmax of the window queries' logits over the older rows (``j < n - window``; GQA: max of the
  group's logits before the softmax), mean over the window, max-pooled with ``kernel``;
- redundancy: cosine similarity of the normalised keys (diagonal zeroed; for each row its most recent
  near-duplicate, similarity > ``similarity_threshold``, is exempted), mean over rows, softmax over rows;
- score = lam * importance - (1 - lam) * redundancy; keep the top ``budget - window`` older rows + the window.
Compaction runs after a layer's attention once a (sequence, head) holds ``budget + buffer`` rows (so every
``buffer`` tokens), prefill included. ``rkv_serving`` (AbridgeKV's comparison) keeps ONE set for every head and
layer: scores averaged over heads, summed over layers, compaction every ``compact_every`` decode steps
(:mod:`zoomr.cache.rkv_serving`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from zoomr.cache.base import PolicyCache, PolicyLayer
from zoomr.cache.config import PolicyConfig, check_positive
from zoomr.cache.queries import push_queries, select_queries
from zoomr.cache.registry import register_policy
from zoomr.cache.snapkv import top_plus_window


def redundancy(keys: torch.Tensor, n: torch.Tensor, threshold: float) -> torch.Tensor:
    """``[B, H, N]`` redundancy of each held row (R-KV ``cal_similarity``, retain direction "last")."""
    B, H, N, _ = keys.shape
    j = torch.arange(N, device=keys.device)
    held = j[None, None, :] < n[:, :, None]
    k = keys.float() / (keys.float().norm(dim=-1, keepdim=True) + 1e-8)
    sim = k @ k.transpose(-1, -2)
    pair = held[:, :, :, None] & held[:, :, None, :] & ~torch.eye(N, dtype=torch.bool, device=keys.device)
    sim = sim * pair
    similar = sim > threshold
    last = torch.where(similar, j, torch.zeros_like(j)).amax(dim=-1)  # most recent near-duplicate (0 if none)
    sim = sim.scatter(-1, last[..., None], 0.0)
    col_mean = sim.sum(dim=-2) / n.clamp_min(1)[:, :, None]
    return torch.softmax(col_mean.masked_fill(~held, float("-inf")), dim=-1)


def rkv_scores(
    keys: torch.Tensor,
    n: torch.Tensor,
    queries: torch.Tensor,
    window: int,
    kernel: int,
    lam: float,
    threshold: float,
) -> torch.Tensor:
    """Scores ``[B, H_kv, N]`` of the older rows ``j < n - window`` (``-inf`` elsewhere)."""
    B, Hkv, N, d = keys.shape
    g = queries.shape[1] // Hkv
    logits = torch.einsum("bhgwd,bhnd->bhgwn", queries.view(B, Hkv, g, -1, d).float(), keys.float()) / d**0.5
    logits = logits.amax(dim=2)  # GQA: max over the group's logits before the softmax
    j = torch.arange(N, device=keys.device)
    older = j[None, None, :] < (n - window)[:, :, None]
    attn = torch.softmax(logits.masked_fill(~older[:, :, None], float("-inf")), dim=-1).mean(dim=-2)
    attn = attn.nan_to_num(0.0).masked_fill(~older, float("-inf"))
    pooled = F.max_pool1d(attn.reshape(B * Hkv, 1, N), kernel, stride=1, padding=kernel // 2).view(B, Hkv, N)
    score = lam * pooled - (1 - lam) * redundancy(keys, n, threshold)
    return score.masked_fill(~older, float("-inf"))


class QueryRing(PolicyCache):
    """Keeps each layer's last ``window`` post-RoPE queries per sequence."""

    def on_queries(self, layer: PolicyLayer, query: torch.Tensor) -> None:
        s = layer.state
        s["q"], s["qv"] = push_queries(s.get("q"), s.get("qv"), query, self.step.valid, self.config.window)

    def on_select_batch(self, index: torch.Tensor) -> None:
        for layer in self.layers:
            if "q" in layer.state:
                layer.state["q"], layer.state["qv"] = select_queries(
                    layer.state["q"], layer.state["qv"], index
                )

    def layer_scores(self, layer: PolicyLayer):
        cfg, rows = self.config, layer.store.rows()
        q = layer.state["q"].to(rows.keys.device)
        s = rkv_scores(rows.keys, rows.n, q, cfg.window, cfg.kernel, cfg.lam, cfg.similarity_threshold)
        return s, rows.n


@dataclass
class RKVConfig(PolicyConfig):
    """R-KV (Cai et al. 2025): score = lam * importance - (1 - lam) * redundancy, per KV head.

    ``window`` most recent queries score the non-window keys (GQA: max over the group's logits), max-pooled
    with ``kernel``; redundancy from key cosine similarity (> ``similarity_threshold``: near-duplicate).
    Compaction to ``budget_rows`` when the rows exceed ``budget_rows + buffer``.
    """

    budget_rows: int | None = 1024
    window: int = 8
    kernel: int = 7
    lam: float = 0.1
    similarity_threshold: float = 0.5
    buffer: int = 128

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive(type(self).__name__, window=self.window, kernel=self.kernel)
        if self.buffer < 0:
            raise ValueError(f"{type(self).__name__}: buffer must be >= 0, got {self.buffer}")
        if self.budget_rows is None or self.budget_rows <= self.window:
            raise ValueError(f"{type(self).__name__}: need budget_rows > window, got {self.budget_rows}")
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"{type(self).__name__}: lam must lie in [0, 1], got {self.lam}")
        if not -1.0 <= self.similarity_threshold <= 1.0:  # a cosine similarity (1: no row is exempted)
            raise ValueError(
                f"{type(self).__name__}: similarity_threshold is a cosine similarity and must lie in [-1, 1], "
                f"got {self.similarity_threshold}"
            )
        if self.kernel % 2 == 0:
            raise ValueError(f"{type(self).__name__}: kernel must be odd, got {self.kernel}")

@register_policy("rkv", RKVConfig)
class RKVCache(QueryRing):
    def after_attention(self, layer: PolicyLayer) -> None:
        cfg, n = self.config, layer.store.n
        due = n >= cfg.budget_rows + cfg.buffer
        if not bool(due.any()):
            return
        with self.selecting():
            scores, n = self.layer_scores(layer)
            keep = top_plus_window(scores, n, cfg.budget_rows, cfg.window)
            held = torch.arange(keep.shape[-1], device=n.device)[None, None, :] < n[:, :, None]
            self.evict(layer.idx, torch.where(due[:, :, None].to(keep.device), keep, held))
