"""AbridgeKV's eviction ablation (AbridgeKV paper, ablations): fixed rules instead of learned code rows.

Generated rows are cut into blocks of ``block_size`` tokens per sequence (the prompt is never compressed,
the open block stays raw). When a block completes — its last token has been fed and attended — each (layer,
KV head) keeps ``quota`` of that block's rows and frees the rest (AbridgeKV's names: block size C, quota
q), chosen by ``rule``:
- ``recency``: the block's last ``quota`` rows;
- ``random``: uniformly at random, drawn per (layer, head, block) from ``seed`` (the same draw for every
  sequence, so a batch behaves like its sequences run alone);
- ``attention``: the top ``quota`` by attention received since the row was written, summed over the GQA
  group's query heads (H2O's statistic, restricted to the block).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zoomr.cache.base import PolicyCache, PolicyLayer
from zoomr.cache.config import PolicyConfig, check_positive
from zoomr.cache.h2o import group_sum
from zoomr.cache.registry import register_policy


def block_keep(
    order: torch.Tensor,
    valid: torch.Tensor,
    start: torch.Tensor,
    block_size: int,
    quota: int,
    scores: torch.Tensor,
) -> torch.Tensor:
    """``[B, H, N]`` keep mask: rows outside ``[start, start + block_size)`` (feed order) stay; inside, the top
    ``quota`` by ``scores`` stay. ``start [B]`` is -1 for sequences with no completed block this step."""
    s = start[:, None, None]
    inside = valid & (s >= 0) & (order >= s) & (order < s + block_size)
    ranked = scores.float().masked_fill(~inside, float("-inf"))
    top = torch.topk(ranked, min(quota, ranked.shape[-1]), dim=-1).indices
    chosen = torch.zeros_like(inside).scatter_(-1, top, True) & inside
    return (valid & ~inside) | chosen


@dataclass
class BlockEvictConfig(PolicyConfig):
    """AbridgeKV's eviction ablation: of each completed block of ``block_size`` generated rows keep ``quota``
    rows, chosen by ``rule``: ``recency`` (the block's last rows), ``random`` (uniform, ``seed``) or
    ``attention`` (accumulated attention received, H2O-style, summed over the GQA group). The prompt and the
    open block stay whole."""

    block_size: int = 512
    quota: int = 128
    rule: str = "recency"
    seed: int = 1234

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive("BlockEvictConfig", block_size=self.block_size, quota=self.quota)
        if self.quota > self.block_size:
            raise ValueError(f"BlockEvictConfig: quota ({self.quota}) > block_size ({self.block_size})")
        if self.rule not in ("recency", "random", "attention"):
            raise ValueError(f"BlockEvictConfig: rule must be recency|random|attention, got {self.rule!r}")


@register_policy("evict_block", BlockEvictConfig)
class BlockEvictCache(PolicyCache):
    def __init__(self, config: BlockEvictConfig, model_config, tokenizer=None) -> None:
        super().__init__(config, model_config, tokenizer)
        self.row_attrs = ("score",) if config.rule == "attention" else ()

    def wants_attention_weights(self, layer: PolicyLayer) -> bool:
        return self.config.rule == "attention"

    def on_attention(self, layer: PolicyLayer, weights: torch.Tensor) -> None:
        with self.selecting():
            layer.store.add_to_attr("score", group_sum(weights, self.kv_heads))

    def _completed_block_start(self) -> torch.Tensor | None:
        """Per sequence: feed index where the block completed by this step starts, or -1."""
        if self.prompt_lengths is None or self.step.is_prefill:
            return None
        C = self.config.block_size
        generated = self.fed - self.prompt_lengths  # rows written after the prompt, this step included
        before = generated - self.step.valid.sum(1).to(generated.device)
        crossed = torch.div(generated, C, rounding_mode="floor") > torch.div(before, C, rounding_mode="floor")
        start = self.prompt_lengths + (torch.div(generated, C, rounding_mode="floor") - 1) * C
        return torch.where(crossed, start, torch.full_like(start, -1))

    def after_attention(self, layer: PolicyLayer) -> None:
        start = self._completed_block_start()
        if start is None or not bool((start >= 0).any()):
            return
        cfg = self.config
        with self.selecting():
            rows = layer.store.rows()
            if cfg.rule == "recency":
                scores = rows.order.float()
            elif cfg.rule == "attention":
                scores = layer.store.attr("score")
            else:
                scores = self._random_scores(layer.idx, rows.order, start)
            keep = block_keep(
                rows.order, rows.valid, start.to(rows.order.device), cfg.block_size, cfg.quota, scores
            )
            self.evict(layer.idx, keep)

    def _random_scores(self, layer_idx: int, order: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        """Uniform scores, drawn per (sequence's block index, layer, head, row of the block) from ``seed``."""
        C, H = self.config.block_size, self.kv_heads
        blocks = torch.div(self.fed - self.prompt_lengths, C, rounding_mode="floor") - 1
        draws = []
        for b in range(order.shape[0]):
            gen = torch.Generator().manual_seed(self.config.seed + 7919 * layer_idx + 104729 * int(blocks[b]))
            draws.append(torch.rand(H, C, generator=gen))
        draw = torch.stack(draws).to(order.device)  # [B, H, C]
        offset = (order - start.to(order.device)[:, None, None]).clamp(0, C - 1)
        return draw.gather(-1, offset)
