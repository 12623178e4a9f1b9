"""R-KV's serving variant, AbridgeKV's comparison arm (AbridgeKV, baselines; R-KV: :mod:`zoomr.cache.rkv`).

One kept set shared by every head and layer: R-KV's per-head scores (:func:`zoomr.cache.rkv.rkv_scores`)
averaged over heads and summed over layers, compaction to ``budget_rows`` (the last ``window`` rows always
kept) at the end of the prefill and every ``compact_every`` generated tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from zoomr.cache.base import Step
from zoomr.cache.config import check_positive
from zoomr.cache.registry import register_policy
from zoomr.cache.rkv import QueryRing, RKVConfig
from zoomr.cache.snapkv import top_plus_window


@dataclass
class RKVServingConfig(RKVConfig):
    """R-KV serving variant (AbridgeKV's comparison): one kept set shared by every head and layer, scores
    averaged over heads and summed over layers, compaction every ``compact_every`` decode steps."""

    compact_every: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive("RKVServingConfig", compact_every=self.compact_every)
        if self.buffer != RKVConfig.buffer:  # R-KV's budget + buffer trigger: this variant never reads it
            raise ValueError(
                f"RKVServingConfig: method.buffer={self.buffer} would be ignored: rkv_serving compacts at the end of "
                "the prefill and every method.compact_every generated tokens, not at budget_rows + buffer rows "
                f"(that is +method=rkv); leave buffer at {RKVConfig.buffer}"
            )


@register_policy("rkv_serving", RKVServingConfig)
class RKVServingCache(QueryRing):
    def __init__(self, config: RKVServingConfig, model_config, tokenizer=None) -> None:
        super().__init__(config, model_config, tokenizer)
        self.decode_steps = 0

    def on_step_end(self, step: Step) -> None:
        cfg = self.config
        before = self.decode_steps
        if not step.is_prefill:  # count generated tokens (one per plain decode step, more for fed chunks)
            self.decode_steps += int(step.valid.sum(1).max())
        crossed = self.decode_steps // cfg.compact_every > before // cfg.compact_every
        due = step.ends_prefill or (not step.is_prefill and crossed)
        if not due or int(self.layers[0].store.n.max()) <= cfg.budget_rows:
            return
        with self.selecting():
            total = None
            for layer in self.layers:  # rows are shared: the same n and order in every layer and head
                scores, n = self.layer_scores(layer)
                per_seq = scores.mean(dim=1)  # average over heads
                total = per_seq if total is None else total + per_seq  # sum over layers
            B, N = total.shape
            keep = top_plus_window(total[:, None], n[:, :1], cfg.budget_rows, cfg.window)
            for layer in self.layers:
                self.evict(layer.idx, keep.expand(B, self.kv_heads, N))
