"""StreamingLLM (Xiao et al., ICLR 2024, §3.2; mit-han-lab/streaming-llm ``kv_cache.py``).

Keep the first ``n_sink`` rows (attention sinks) and the most recent ``budget_rows - n_sink`` rows of every
(sequence, KV head). Eviction runs after each layer's attention, so the current token sees the resident rows
plus itself and ``budget_rows`` rows stay between steps; a prompt longer than the budget is attended in full
at prefill and cut afterwards (as the reference does before the next forward).

``reposition=True`` is the paper's pos_shift variant: after every eviction the kept keys are re-rotated to
their index inside the cache and new tokens take position ``rows held`` (RoPE is a rotation group, so the
post-RoPE keys are moved by the position difference). Default: original positions (R-KV's baseline).

``compression_ratio`` (with ``budget_rows=None``) is the prompt-compression variant of kvpress's
``StreamingLLMPress`` that the KVzap paper compares against: once, at the end of the prefill, each prompt
keeps its sinks and its most recent ``int(n * (1 - ratio)) - n_sink`` rows; decoding appends without
eviction.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zoomr.cache.base import PolicyCache, PolicyLayer
from zoomr.cache.config import PolicyConfig, check_ratio
from zoomr.cache.ratio import kept_at_ratio
from zoomr.cache.registry import register_policy
from zoomr.cache.rope import rope_inv_freq


def sink_window_keep(n: torch.Tensor, width: int, n_sink: int, recent: int | torch.Tensor) -> torch.Tensor:
    """``[B, H, width]`` bool: rows ``j < n_sink`` or ``j >= n - recent`` (rows in insertion order);
    ``recent``: one number or one per ``[B, H]``."""
    j = torch.arange(width, device=n.device)[None, None, :]
    recent = torch.as_tensor(recent, device=n.device).expand_as(n)[:, :, None]
    n = n[:, :, None]
    return (j < n) & ((j < n_sink) | (j >= n - recent))


@dataclass
class StreamingConfig(PolicyConfig):
    """StreamingLLM (Xiao et al. 2024): the first ``n_sink`` rows + the most recent ``budget_rows - n_sink``.

    ``reposition``: re-rotate kept keys to their positions inside the cache (the paper's pos_shift variant);
    default keeps original positions (as R-KV's baseline does).
    """

    budget_rows: int | None = 1024
    n_sink: int = 4
    reposition: bool = False
    compression_ratio: float | None = None  # variant: prune each prompt once to this ratio (budget_rows=None)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.compression_ratio is not None:
            check_ratio("StreamingConfig", self.compression_ratio, self.budget_rows)
            if self.n_sink < 0:
                raise ValueError(f"StreamingConfig: need n_sink >= 0, got {self.n_sink}")
            return
        if self.budget_rows is None or self.n_sink < 0 or self.budget_rows <= self.n_sink:
            raise ValueError(
                f"StreamingConfig: need budget_rows > n_sink >= 0, got {self.budget_rows}, {self.n_sink}"
            )


@register_policy("streaming", StreamingConfig)
class StreamingCache(PolicyCache):
    def __init__(self, config: StreamingConfig, model_config, tokenizer=None) -> None:
        super().__init__(config, model_config, tokenizer)
        self.recent = None if config.budget_rows is None else config.budget_rows - config.n_sink
        self.inv_freq = rope_inv_freq(self.model_config, self.head_dim) if config.reposition else None

    def after_attention(self, layer: PolicyLayer) -> None:
        store, cfg = layer.store, self.config
        if cfg.compression_ratio is not None:  # prompt-only pruning at a ratio (kvpress's StreamingLLMPress)
            if not self.step.ends_prefill:
                return
            recent = kept_at_ratio(store.n, cfg.compression_ratio) - cfg.n_sink
        elif store.n_max <= cfg.budget_rows:
            return
        else:
            recent = self.recent
        with self.selecting():
            if cfg.compression_ratio is None and store.n_min == store.n_max:
                store.evict_span(cfg.n_sink, store.n_max - recent)  # every (b, h) holds the same rows: one span
            else:
                keep = sink_window_keep(store.n, store.n_max, cfg.n_sink, recent)
                self.evict(layer.idx, keep)
            if self.inv_freq is not None:
                flat, valid = store.flat_index()
                new_pos = torch.arange(flat.shape[-1], device=flat.device).expand_as(flat)
                store.reposition(new_pos, self.inv_freq)

    def next_positions(self, valid: torch.Tensor) -> torch.Tensor:
        store = self.layers[0].store
        if self.inv_freq is None or store is None:
            return super().next_positions(valid)
        rank = torch.cumsum(valid.long(), dim=1) - 1  # in-cache positions: rows held, then onwards
        return (store.n[:, 0].to(valid.device)[:, None] + rank).clamp_min(0) * valid
