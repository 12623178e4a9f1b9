"""KVzap pruning (KVzap paper §3.3, Algorithm 1; DMS-style inference as kvpress's ``DMSPress``).

Each token is scored ONCE per layer, when its row is appended, by the layer's surrogate applied to the
attention module's input hidden state (captured by forward pre-hooks that :meth:`KVzapCache.attach`
installs on every ``self_attn``). After the attention of each step (compression after attention, as in
the paper's experiments), every row of a (sequence, KV head) that has ``window`` newer tokens and a score
below ``threshold`` is evicted — physically: the layer's pages are rebuilt from the kept rows. Rows are
decided once: a row that survives its decision never scores lower later, so it is kept for good. Heads keep
different numbers of rows (ragged). ``decoding=False`` prunes only during prefill steps.

The surrogate loads in one overridable place (:meth:`KVzapCache.load_surrogate`; tests pass
``surrogate=``): ``<surrogate_dir>/<model_type>`` in kvpress's format, so NVIDIA's published
``nvidia/KVzap-{linear,mlp}-<model>`` checkpoints work once downloaded.

Compression (fraction of KV pairs removed, kvpress's definition) per layer and sequence:
:meth:`KVzapCache.compression` during a run, :func:`compression_of` from an engine output.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from zoomr.cache.base import PolicyCache, PolicyLayer
from zoomr.cache.registry import register_policy
from zoomr.kvzap.scoring import decoder_of
from zoomr.kvzap.surrogate import KVzapModel, check_matches, load_surrogate
from zoomr.schemas.kvzap import KVzapMethod, KVzipOracleConfig

SCORE = "kvzap_score"


@register_policy("kvzap", config=KVzapMethod)
class KVzapCache(PolicyCache):
    row_attrs = (SCORE,)
    _bytes_skip = (*PolicyCache._bytes_skip, "surrogate", "_hidden")

    def __init__(
        self, config: KVzapMethod, model_config, tokenizer=None, surrogate: KVzapModel | None = None
    ) -> None:
        super().__init__(config, model_config, tokenizer)
        self.surrogate = surrogate if surrogate is not None else self.load_surrogate()
        check_matches(
            self.surrogate,
            hidden_size=self.model_config.hidden_size,
            num_layers=self.num_layers,
            num_kv_heads=self.kv_heads,
        )
        self._hidden: dict[int, torch.Tensor] = {}

    def load_surrogate(self) -> KVzapModel:
        """The surrogate checkpoint ``<surrogate_dir>/<model_type>`` (override to load from elsewhere)."""
        return load_surrogate(Path(self.config.surrogate_dir) / self.config.model_type)

    # ------------------------------------------------------------------ model hooks
    def attach(self, model: torch.nn.Module) -> list[Any]:
        """Forward pre-hooks on every ``self_attn``: keep this step's attention input per layer."""
        self.surrogate.to(next(model.parameters()).device)

        def capture(module, args, kwargs):
            self._hidden[module.layer_idx] = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]

        return [
            layer.self_attn.register_forward_pre_hook(capture, with_kwargs=True)
            for layer in decoder_of(model).layers
        ]

    # ------------------------------------------------------------------ policy hooks
    def on_append(self, layer: PolicyLayer) -> None:
        """Score the rows just appended (this step's valid tokens) from their hidden states."""
        hidden = self._hidden.pop(layer.idx, None)
        if hidden is None:
            raise RuntimeError(
                "KVzap needs the attention inputs: run through zoomr.engine.generate, or call "
                "cache.attach(model) before using the model with this cache"
            )
        step, store = self.step, layer.store
        with self.selecting():
            scores = self.surrogate.score(layer.idx, hidden)  # [B, S, H_kv]
            valid = step.valid.to(scores.device)
            m = valid.sum(1)  # new rows per sequence (the same for each of its heads)
            first = torch.argsort((~valid).to(torch.int8), dim=1, stable=True)  # valid tokens first, in order
            new = scores.gather(1, first[:, :, None].expand_as(scores)).transpose(1, 2)  # [B, H, S]
            flat, _ = store.flat_index()
            r = torch.arange(new.shape[-1], device=flat.device)
            j = store.n[:, :, None] - m.to(flat.device)[:, None, None] + r  # row index of the r-th new token
            mine = (r < m.to(flat.device)[:, None, None]).expand_as(j)
            if flat.shape[-1]:
                rows = flat.gather(-1, j.clamp(0, flat.shape[-1] - 1))
                store.attrs[SCORE].view(-1)[rows[mine]] = new.to(flat.device)[mine]

    def after_attention(self, layer: PolicyLayer) -> None:
        """Evict rows scoring below the threshold that have ``window`` newer tokens."""
        if not self.config.decoding and not self.step.is_prefill:
            return
        store = layer.store
        with self.selecting():
            flat, valid = store.flat_index()
            age = self.fed.to(store.device)[:, None, None] - 1 - store.order.view(-1)[flat]  # newer tokens
            score = store.attrs[SCORE].view(-1)[flat]
            drop = valid & (age >= self.config.window) & (score < self.config.threshold)
            if bool(drop.any()):
                self.evict(layer.idx, ~drop)

    # ------------------------------------------------------------------ stats
    def compression(self) -> torch.Tensor:
        """``[L, B]`` fraction of this run's KV pairs removed so far, per layer and sequence."""
        rows = self.resident_rows().float()  # [L, B, H]
        total = self.fed.cpu().float() * self.kv_heads
        return 1 - rows.sum(-1) / total.clamp_min(1)


def compression_of(output, kv_heads: int) -> dict[str, Any]:
    """Fraction of KV pairs removed for one engine output: overall, per layer, and right after prefill."""
    rows = output.stats.rows  # [T, L, H]
    fed = output.prompt_tokens + output.n_forced + max(output.n_tokens - 1, 0)  # the last sample is not fed
    per_layer = 1 - rows[-1].sum(-1) / (kv_heads * fed)
    prefill = 1 - rows[0].sum(-1) / (kv_heads * output.prompt_tokens)
    return {
        "compression": float(per_layer.mean()),
        "per_layer": [float(x) for x in per_layer],
        "prefill_compression": float(prefill.mean()),
        "tokens": fed,
    }


@register_policy("kvzip", config=KVzipOracleConfig)
class KVzipOracleCache(PolicyCache):
    """KVzip / KVzip+ as an oracle (KVzap paper §3.1-3.2): the prompt's pairs scored by context reconstruction.

    Right after the prefill step the prompt of every sequence is scored with :func:`kvzip_scores` (one
    extra chunked eager forward over the repeat pretext, the cost KVzap removes) and pruned once; decoding
    then appends without pruning. Needs the model (:meth:`attach`) and the tokenizer (chat template).
    """

    _bytes_skip = (*PolicyCache._bytes_skip, "model", "log_scores")

    def __init__(self, config: KVzipOracleConfig, model_config, tokenizer=None) -> None:
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

    def on_step_end(self, step) -> None:
        if not step.is_prefill:
            return
        if self.prompts is not None:
            raise RuntimeError(
                "the KVzip oracle scores the whole prompt: prefill it in one step (prefill_chunk=None)"
            )
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
