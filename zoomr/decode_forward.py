"""The decode engine's forward: transformers' own decoder layers, driven without the model-level wrapper.

``model(input_ids=…, cache=policy)`` spends a tenth of a batch-1 decode step of a small model outside its
decoder layers: output-capturing and kwarg-deprecation wrappers, a causal mask the ``"zoomr"`` attention
never reads (it builds its own from the rows the policy holds), and RoPE's cos/sin recomputed every step.
:class:`DecoderForward` runs the same modules in the same order — ``embed_tokens``, every decoder layer
(attention hooks, and the policy's cache updates, fire as usual), the final norm, ``lm_head`` on the kept
positions — with cos/sin looked up in a table the model's own rotary module filled once (grown by
doubling). The logits are the model's (equal bit for bit on the tiny models; ``tests/test_decode_forward.py``
allows 1e-6).

It applies only where that is exact: a llama / qwen2 / qwen3 / phi3 causal LM with full attention in every layer, a
RoPE whose frequencies do not depend on the sequence length, and no forward hooks on the model or its
decoder stack (a hook there expects ``model(...)``). Anything else goes through ``model(...)``.
"""

from __future__ import annotations

from typing import Any

import torch

#: model types whose causal LM is ``embed_tokens`` → layers → ``norm`` → ``lm_head`` (no logit scaling)
DIRECT_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "phi3"})
#: RoPE types with position-independent frequencies (``dynamic`` / ``longrope`` rescale with the length)
STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn"})


def _has_hooks(module: torch.nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks)


def direct_path_reason(model: torch.nn.Module) -> str | None:
    """Why ``model`` must go through ``model(...)`` (None: the direct path is exact for it)."""
    return _structure_reason(model) or _hooks_reason(model)


def _structure_reason(model: torch.nn.Module) -> str | None:
    config = getattr(model, "config", None)
    inner = getattr(model, "model", None)
    if config is None or getattr(config, "model_type", None) not in DIRECT_MODEL_TYPES:
        return f"model type {getattr(config, 'model_type', None)!r} is not one of {sorted(DIRECT_MODEL_TYPES)}"
    if inner is None or not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return "no model.model.{embed_tokens, layers, norm, rotary_emb}"
    if not hasattr(model, "lm_head"):
        return "no lm_head"
    if any(t != "full_attention" for t in (getattr(config, "layer_types", None) or [])):
        return "sliding-window layers"
    if config.model_type == "phi3" and config.sliding_window is not None:  # phi3: one window for every layer
        return "sliding-window attention"
    if getattr(inner.rotary_emb, "rope_type", "default") not in STATIC_ROPE_TYPES:
        return f"RoPE type {inner.rotary_emb.rope_type!r} rescales with the sequence length"
    return None


def _hooks_reason(model: torch.nn.Module) -> str | None:
    hooks = torch.nn.modules.module
    if _has_hooks(model) or _has_hooks(model.model) or hooks._global_forward_hooks or hooks._global_forward_pre_hooks:
        return "forward hooks on the model or its decoder stack"
    return None


class DecoderForward:
    """``forward(input_ids, positions, cache, keep_last)`` → logits ``[B, S or 1, V]`` for one engine step."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.structure_reason = _structure_reason(model)  # fixed for the model; hooks are checked per call
        self._cos: torch.Tensor | None = None
        self._sin: torch.Tensor | None = None

    def _rope(self, positions: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[B, S, d]`` at ``positions``, rows of the table the model's rotary module computed."""
        need = int(positions.max()) + 1
        if self._cos is None or self._cos.shape[0] < need or self._cos.dtype != like.dtype:
            size = max(need, 1024, 2 * (0 if self._cos is None else self._cos.shape[0]))
            arange = torch.arange(size, device=like.device)[None]
            cos, sin = self.model.model.rotary_emb(like, arange)
            self._cos, self._sin = cos[0], sin[0]
        return self._cos[positions], self._sin[positions]

    def __call__(
        self, input_ids: torch.Tensor, positions: torch.Tensor, cache: Any, keep_last: bool = False
    ) -> torch.Tensor:
        if self.structure_reason is not None or _hooks_reason(self.model) is not None:
            kwargs = {"logits_to_keep": 1} if keep_last else {}
            return self.model(
                input_ids=input_ids, position_ids=positions, cache=cache, use_cache=True, **kwargs
            ).logits
        inner = self.model.model
        hidden = inner.embed_tokens(input_ids)
        rope = self._rope(positions, hidden)
        for layer in inner.layers:
            hidden = layer(
                hidden, attention_mask=None, position_ids=positions, cache=cache, use_cache=True,
                position_embeddings=rope,
            )  # fmt: skip
        if keep_last:
            hidden = hidden[:, -1:]
        return self.model.lm_head(inner.norm(hidden))
