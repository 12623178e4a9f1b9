"""The ``"zoomr"`` attention implementation: ragged per-(sequence, KV head) masks and the policy hooks.

Registered with transformers' ``AttentionInterface`` and ``AttentionMaskInterface`` at import, so a model
loaded with ``attn_implementation="zoomr"`` (or switched with :func:`use_policy_attention`) calls
:func:`policy_attention` in every attention module. When the keys come from a :class:`PolicyCache` update
(looked up by tensor identity, so ``model.generate(cache=policy)`` needs no extra wiring), it

1. gives the policy the post-RoPE queries (``on_queries``);
2. builds the mask from the rows the policy holds: row j of (b, h) is visible to query s iff it is held and
   was fed no later than s (feed order, not position: code rows placed inside a span stay causal);
3. computes attention with SDPA, or eagerly when the policy wants the softmax weights (``on_attention``);
4. calls ``after_attention``.
GQA: query head i uses KV head ``i // g`` (transformers' ``repeat_kv`` layout); queries are folded to
``[B, H_kv, g*S, d]`` so keys are never repeated. Any other cache falls back to plain SDPA.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTN_IMPLEMENTATION = "zoomr"

# id(keys returned by PolicyCache.update) -> (weakref to the keys, weakref to the cache, layer index)
_LIVE: dict[int, tuple[Any, Any, int]] = {}


def register_view(keys: torch.Tensor, cache: Any, layer_idx: int) -> None:
    """Remember that ``keys`` were produced by ``cache.update`` at ``layer_idx`` (see :func:`policy_attention`)."""
    if len(_LIVE) > 256:  # entries are popped when attention reads them; drop the ones never read
        for k in [k for k, (kref, _, _) in _LIVE.items() if kref() is None]:
            del _LIVE[k]
    _LIVE[id(keys)] = (weakref.ref(keys), weakref.ref(cache), layer_idx)


def _lookup(key: torch.Tensor):
    entry = _LIVE.pop(id(key), None)
    if entry is None or entry[0]() is not key:
        return None, None
    return entry[1](), entry[2]


def ragged_mask(
    row_order: torch.Tensor, row_valid: torch.Tensor, q_order: torch.Tensor, q_valid: torch.Tensor
) -> torch.Tensor:
    """``[B, H, S, N]`` bool: row held and fed no later than the query. Pad queries see every held row
    (their outputs are never used; this keeps the softmax finite)."""
    vis = row_valid[:, :, None, :] & (row_order[:, :, None, :] <= q_order[:, None, :, None])
    vis = torch.where(q_valid[:, None, :, None], vis, row_valid[:, :, None, :])
    return vis | ~vis.any(-1, keepdim=True)  # a (b, h) holding nothing: attend to padding, output unused


def _batch_heads(t: torch.Tensor) -> torch.Tensor:
    """``[B, H, N, d]`` -> ``[B*H, N, d]`` without a copy when the heads are evenly strided (a view of the
    store's ``[B, H, cap, d]`` buffer is): batched matmuls on the 4-D strided view copy it first."""
    B, H, N, d = t.shape
    if t.stride(0) == H * t.stride(1) and t.stride(3) == 1:
        return t.as_strided((B * H, N, d), (t.stride(1), t.stride(2), 1), t.storage_offset())
    return t.reshape(B * H, N, d)


def policy_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    cache, layer_idx = _lookup(key)
    if cache is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    layer = cache.layers[layer_idx]
    rows, step = layer.view, cache.step
    layer.attended = True
    if step.auto and attention_mask is not None and query.shape[0] > 1:
        raise NotImplementedError(
            "a padded batch reached a policy cache through model.generate / a plain forward: its rows would store the "
            "pads and misalign after eviction. Use zoomr.engine.generate for batches (pads are never stored there)."
        )
    B, Hq, S, d = query.shape
    Hkv, N = key.shape[1], key.shape[2]
    g = Hq // Hkv
    scaling = d**-0.5 if scaling is None else scaling
    cache.on_queries(layer, query)
    q = query.reshape(B, Hkv, g * S, d)
    if S == 1 and rows.all_valid and step.all_valid:
        mask = None  # decoding, every row held by every head: nothing to mask
    else:
        if S > 1 and bool((rows.order == rows.order[:, :1]).all()):
            m = ragged_mask(rows.order[:, :1], rows.valid[:, :1], step.order, step.valid)  # heads share rows
        else:
            m = ragged_mask(rows.order, rows.valid, step.order, step.valid)
        mask = m[:, :, None].expand(B, m.shape[1], g, S, N).reshape(B, m.shape[1], g * S, N)
    if cache.wants_attention_weights(layer):
        kf, vf = _batch_heads(key), _batch_heads(value)
        scores = torch.bmm(q.reshape(B * Hkv, g * S, d), kf.transpose(1, 2)).view(B, Hkv, g * S, N) * scaling
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.bmm(weights.view(B * Hkv, g * S, N), vf).view(B, Hkv, g * S, d)
        w = weights.view(B, Hq, S, N)
        if not step.all_valid:
            w = w * step.valid[:, None, :, None].to(weights.dtype)  # pad queries: 0
        cache.on_attention(layer, w)
    else:
        out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling)
    out = out.view(B, Hq, S, d).transpose(1, 2).contiguous()
    cache.after_attention(layer)
    return out, None


def use_policy_attention(model: torch.nn.Module) -> torch.nn.Module:
    """Switch an already loaded model to the ``"zoomr"`` attention implementation (in place)."""
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    return model


AttentionInterface.register(ATTN_IMPLEMENTATION, policy_attention)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
