"""KVzap pruning (KVzap paper §3.3, Algorithm 1; DMS-style inference as kvpress's ``DMSPress``).

Each token is scored ONCE per layer, when its row is appended, by the layer's surrogate applied to the
attention module's input hidden state (captured by the forward pre-hooks that :meth:`PolicyCache.attach`
installs on every ``self_attn`` and fed to :meth:`KVzapCache.on_attention_input`). After the attention of each step (compression after attention, as in
the paper's experiments), every row of a (sequence, KV head) that has ``window`` newer tokens and a score
below ``threshold`` is evicted — physically: the layer's pages are rebuilt from the kept rows. Rows are
decided once: a row that survives its decision never scores lower later, so it is kept for good. Heads keep
different numbers of rows (ragged). ``decoding=False`` prunes only during prefill steps.

The surrogate loads in one overridable place (:meth:`KVzapCache.load_surrogate`; tests pass
``surrogate=``): ``<surrogate_dir>/<model_type>`` in kvpress's format, so NVIDIA's published
``nvidia/KVzap-{linear,mlp}-<model>`` checkpoints work once downloaded.

Compression (fraction of KV pairs removed, kvpress's definition) per layer and sequence:
:meth:`KVzapCache.compression` during a run, :func:`compression_of` from an engine output. The KVzip oracle KVzap approximates: :mod:`zoomr.cache.kvzip`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from zoomr.cache.base import PolicyCache, PolicyLayer
from zoomr.cache.config import PolicyConfig
from zoomr.cache.registry import register_policy
from zoomr.kvzap.surrogate import KVzapModel, check_matches, fitted_for, load_surrogate, model_identity
from zoomr.schemas.kvzap import KVzapFit

log = logging.getLogger(__name__)
_WARNED: set[tuple[Path, str]] = set()  # (surrogate, served model) said in this process: a cache is built per batch

SCORE = "kvzap_score"


@dataclass
class KVzapMethod(PolicyConfig):
    """``+method=kvzap``: fitting (``python -m train``) and the threshold pruning policy (``python -m eval``).

    Policy (paper §3.3, Algorithm 1; kvpress ``DMSPress``): every token is scored once per layer from its
    attention input by the surrogate ``<surrogate_dir>/<model_type>``; a KV pair scoring below ``threshold``
    is evicted, after the attention of the step, once ``window`` newer tokens exist. ``decoding=false``
    prunes during prefill only. ``threshold: -.inf`` keeps everything (full KV).
    """

    trainer: str | None = "kvzap"  # train.<trainer> fits the surrogates
    pairs_dir: str = "runs/kvzap/pairs"
    surrogate_dir: str = "runs/kvzap"  # holds linear/ and mlp/ (ours, or NVIDIA's nvidia/KVzap-* downloads)
    model_type: str = "mlp"  # linear | mlp: which surrogate the policy uses
    threshold: float = -4.0
    window: int = 128
    decoding: bool = True
    fit: KVzapFit = field(default_factory=KVzapFit)
    TRAINING_ONLY: ClassVar[tuple[str, ...]] = ("trainer", "pairs_dir", "fit")  # python -m train's surrogate fit

    @classmethod
    def served_files(cls, method: Mapping[str, Any]) -> dict[str, Path]:
        """The checkpoint a ``+method=`` node (plain containers) serves with, ``<surrogate_dir>/<model_type>``: the
        evaluator fingerprints its content (:func:`zoomr.cache.registry.served_checkpoints`)."""
        return {"surrogate": Path(method.get("surrogate_dir", cls.surrogate_dir)) / method.get("model_type", cls.model_type)}

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.model_type not in ("linear", "mlp"):
            raise ValueError(f"KVzapMethod: model_type must be linear|mlp, got {self.model_type!r}")
        if self.window < 0:
            raise ValueError(f"KVzapMethod: window must be >= 0, got {self.window}")
        if math.isnan(self.threshold):
            raise ValueError("KVzapMethod: threshold is NaN (give a number; -.inf keeps every row)")


@register_policy("kvzap", KVzapMethod)
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
        """The surrogate checkpoint ``<surrogate_dir>/<model_type>`` (override to load from elsewhere). One fitted
        for another checkpoint (its ``fitted_by.json``) is served with a warning: ``surrogate_dir`` is per model
        *name* by default, so two checkpoints of one config (e.g. ``model=tiny-testbed model.hf_id=…``) share it."""
        path = Path(self.config.surrogate_dir) / self.config.model_type
        fitted, serving = fitted_for(path), model_identity(getattr(self.model_config, "_name_or_path", None))
        if fitted and serving and fitted != serving and (path, serving) not in _WARNED:
            _WARNED.add((path, serving))
            log.warning("kvzap: the surrogate %s was fitted for %s, not for the model served (%s): its scores predict "
                        "another model's importance; fit one for this model (python -m train +method=kvzap "
                        "model.hf_id=...) into its own method.surrogate_dir", path, fitted, serving)  # fmt: skip
        return load_surrogate(path)

    # ------------------------------------------------------------------ model hooks
    wants_attention_input = True  # the engine's pre-hooks feed on_attention_input

    def attach(self, model: torch.nn.Module) -> list[Any]:
        """Put the surrogate on the model's device (the engine calls this before the first forward)."""
        self.surrogate.to(next(model.parameters()).device)
        return super().attach(model)

    def on_attention_input(self, layer_idx: int, hidden_states: torch.Tensor) -> None:
        """Keep this step's attention input of layer ``layer_idx`` until its rows are appended."""
        self._hidden[layer_idx] = hidden_states

    # ------------------------------------------------------------------ policy hooks
    def on_append(self, layer: PolicyLayer) -> None:
        """Score the rows just appended (this step's valid tokens) from their hidden states."""
        hidden = self._hidden.pop(layer.idx, None)
        if hidden is None:
            raise RuntimeError(
                "KVzap needs the attention inputs: run it through zoomr.engine.generate, or call "
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
    # tokens fed by the last recorded step: the prompt, then one sampled token per decode step (the last
    # sampled token is never fed); forced tokens (none for KVzap) counted as a whole
    fed = output.prompt_tokens + int(output.stats.step[-1]) + output.n_forced
    per_layer = 1 - rows[-1].sum(-1) / (kv_heads * fed)
    prefill = 1 - rows[0].sum(-1) / (kv_heads * output.prompt_tokens)
    return {
        "compression": float(per_layer.mean()),
        "per_layer": [float(x) for x in per_layer],
        "prefill_compression": float(prefill.mean()),
        "tokens": fed,
    }
