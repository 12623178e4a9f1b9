"""KVzip / KVzip+ as an oracle pruning policy (KVzap paper §3.1-3.2; kvpress ``KVzipPress``), ``+method=kvzip``.

The prompt's KV pairs are scored once by context reconstruction (:func:`zoomr.kvzap.scoring.kvzip_scores`
over the repeat pretext, :mod:`zoomr.kvzap.pretext`) right after an unchunked prefill, and pruned by a
ratio or by KVzap's threshold rule with the exact scores; decoding then appends without pruning. This is
the oracle the KVzap surrogate (:mod:`zoomr.cache.kvzap`) approximates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import torch

from zoomr.cache.base import PolicyCache
from zoomr.cache.config import PolicyConfig
from zoomr.cache.registry import register_policy
from zoomr.schemas.checks import AT_LEAST_ONE, NON_NEGATIVE, check_fields


@dataclass
class KVzipConfig(PolicyConfig):
    """``+method=kvzip``: KVzip / KVzip+ scores of the prompt as an oracle pruning policy (prefill only).

    The prompt is scored once with the repeat pretext right after an unchunked prefill. ``mode=ratio``
    (KVzip, kvpress ``KVzipPress``): evict the ``ratio`` lowest-scoring pairs over all layers and heads
    (``layerwise``: the same ratio in every layer), the first ``n_sink`` tokens protected. ``mode=threshold``:
    KVzap's rule with the exact scores (log s < ``threshold`` and ``window`` newer prompt tokens), the
    oracle a KVzap surrogate approximates.
    """

    score: str = "kvzip_plus"  # kvzip_plus | kvzip
    mode: str = "ratio"  # ratio | threshold
    ratio: float = 0.5
    layerwise: bool = False
    n_sink: int = 4
    threshold: float = -4.0
    window: int = 128
    chunk_size: int = 512
    instruction: str = "\n\nRepeat the previous context exactly."

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.score not in ("kvzip_plus", "kvzip"):
            raise ValueError(f"KVzipConfig: score must be kvzip_plus|kvzip, got {self.score!r}")
        if self.mode not in ("ratio", "threshold"):
            raise ValueError(f"KVzipConfig: mode must be ratio|threshold, got {self.mode!r}")
        if not 0 <= self.ratio < 1:
            raise ValueError(f"KVzipConfig: ratio must be in [0, 1), got {self.ratio}")
        check_fields(self, "method", n_sink=NON_NEGATIVE, window=NON_NEGATIVE, chunk_size=AT_LEAST_ONE)
        if math.isnan(self.threshold):
            raise ValueError("KVzipConfig: threshold is NaN (give a number; -.inf keeps every row)")
        # the other mode's fields: method.mode=threshold method.ratio=0.3 ran the threshold rule, recorded as ratio 0.3
        other = ("threshold", "window") if self.mode == "ratio" else ("ratio", "layerwise", "n_sink")
        defaults = {f.name: f.default for f in fields(self)}
        if changed := [f"method.{k}={getattr(self, k)!r}" for k in other if getattr(self, k) != defaults[k]]:
            raise ValueError(
                f"KVzipConfig: {', '.join(changed)} would be ignored with method.mode={self.mode} (ratio, layerwise "
                "and n_sink belong to mode=ratio, threshold and window to mode=threshold); set the mode they belong "
                "to or leave them at their defaults"
            )


@register_policy("kvzip", KVzipConfig)
class KVzipCache(PolicyCache):
    """KVzip / KVzip+ as an oracle (KVzap paper §3.1-3.2): the prompt's pairs scored by context reconstruction.

    Right after the prefill step the prompt of every sequence is scored with :func:`kvzip_scores` (one
    extra chunked eager forward over the repeat pretext, the cost KVzap removes) and pruned once; decoding
    then appends without pruning. Needs the model (:meth:`attach`) and the tokenizer (chat template).
    """

    _bytes_skip = (*PolicyCache._bytes_skip, "model", "log_scores")

    def __init__(self, config: KVzipConfig, model_config, tokenizer=None) -> None:
        super().__init__(config, model_config, tokenizer)
        if tokenizer is None:
            raise ValueError(
                "the KVzip oracle needs the tokenizer (repeat pretext through its chat template)"
            )
        self.model: torch.nn.Module | None = None
        self.prompts: list[list[int]] | None = None
        self.log_scores: list[torch.Tensor] = []  # per sequence [L, H_kv, n] (for inspection)

    def attach(self, model: torch.nn.Module) -> list[Any]:
        self.model = model
        return []

    def on_step_begin(self, step) -> None:
        """Refuse a prefill in chunks before its first chunk runs: that chunk was scored as the whole prompt (a
        left-padded sequence's all-pad chunk ended in pretext.py's bare 'empty context' ValueError)."""
        if step.is_prefill and (not step.ends_prefill or self.prompts is not None):
            raise RuntimeError(
                "the KVzip oracle scores the whole prompt: prefill it in one step (prefill_chunk=None)"
            )

    def on_step_end(self, step) -> None:
        if not step.is_prefill:
            return
        if self.model is None:
            raise RuntimeError("call cache.attach(model) first (zoomr.engine.generate does)")
        ids = step.input_ids.cpu()
        self.prompts = [ids[b][step.valid[b].cpu()].tolist() for b in range(ids.shape[0])]
        with self.selecting():
            keep = [self._keep_mask(prompt) for prompt in self.prompts]  # [L, H, n_b] each
            for layer in range(self.num_layers):
                store = self.layers[layer].store
                mask = torch.zeros(store.batch, store.heads, int(store.n.max()), dtype=torch.bool)
                for b, k in enumerate(keep):
                    mask[b, :, : k.shape[-1]] = k[layer]
                self.evict(layer, mask.to(store.device))

    def _keep_mask(self, prompt: list[int]) -> torch.Tensor:
        from zoomr.kvzap.pretext import build_repeat_pretext
        from zoomr.kvzap.scoring import kvzip_scores

        c = self.config
        pretext = build_repeat_pretext(self.tokenizer, prompt, c.instruction)
        result = kvzip_scores(self.model, pretext, chunk_size=c.chunk_size)
        log_s = result.log(plus=c.score == "kvzip_plus")  # [L, H, n]
        self.log_scores.append(log_s)
        L, H, n = log_s.shape
        if c.mode == "threshold":
            return (log_s >= c.threshold) | (torch.arange(n) >= n - c.window)
        s = log_s.clone()
        s[..., : c.n_sink] = math.inf
        if c.layerwise:
            k = int(H * n * c.ratio)
            order = s.view(L, -1).argsort(dim=-1)[:, :k]
            drop = torch.zeros(L, H * n, dtype=torch.bool).scatter_(1, order, True)
        else:
            k = int(L * H * n * c.ratio)
            drop = torch.zeros(L * H * n, dtype=torch.bool)
            drop[s.view(-1).argsort()[:k]] = True
        return ~drop.view(L, H, n)
