"""Per-layer masks inside a transformers model: a registered attention function (``"abridge"``).

The model forward receives ``abridge_masks`` (one mask per layer, from :func:`zoomr.abridge.mask.layer_masks`)
as a keyword argument; transformers passes it down to every attention call, where this function picks
``abridge_masks[module.layer_idx]``: a ``BlockMask`` runs FlexAttention (compiled on CUDA, eager
elsewhere), a boolean tensor runs transformers' own SDPA path, a ``ChunkedMask`` the same SDPA path per
chunk of queries over the keys it gathers. No mask function is registered for the
name, so transformers builds no causal mask of its own (it would be discarded anyway).
Without ``abridge_masks`` the function is plain SDPA, so a model switched to it still generates.
"""

from __future__ import annotations

import functools

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from zoomr.abridge.mask import ChunkedMask

ATTN_NAME = "abridge"


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def _flex_forward(module, query, key, value, block_mask, scaling=None, **_):
    from torch.nn.attention.flex_attention import flex_attention

    fn = _compiled_flex() if query.is_cuda else flex_attention
    out = fn(query, key, value, block_mask=block_mask, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def _chunked_forward(module, query, key, value, mask: ChunkedMask, **kwargs):
    """SDPA per chunk of queries over its gathered keys (:class:`zoomr.abridge.mask.ChunkedMask`)."""
    b, heads, length, dim = query.shape
    n, chunk = mask.kv_index.shape[1], mask.chunk
    q = torch.nn.functional.pad(query, (0, 0, 0, n * chunk - length))
    q = q.view(b, heads, n, chunk, dim).transpose(1, 2).reshape(b * n, heads, chunk, dim)
    rows = torch.arange(b, device=query.device)[:, None, None]

    def gather(x: torch.Tensor) -> torch.Tensor:  # [B, H_kv, S, D] -> [B·n, H_kv, W, D]
        return x.transpose(1, 2)[rows, mask.kv_index].permute(0, 1, 3, 2, 4).reshape(b * n, x.shape[1], mask.width, dim)

    out, _ = sdpa_attention_forward(module, q, gather(key), gather(value), mask.allowed, **kwargs)
    return out.reshape(b, n * chunk, heads, dim)[:, :length].contiguous(), None


def abridge_attention(module, query, key, value, attention_mask, abridge_masks=None, **kwargs):
    """Attention with the layer's own AbridgeKV mask (see module docstring)."""
    if abridge_masks is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    mask = abridge_masks[module.layer_idx]
    if isinstance(mask, torch.Tensor):
        return sdpa_attention_forward(module, query, key, value, mask, **kwargs)
    if isinstance(mask, ChunkedMask):
        return _chunked_forward(module, query, key, value, mask, **kwargs)
    return _flex_forward(module, query, key, value, mask, **kwargs)


def use_abridge_attention(model) -> None:
    """Register the function (idempotent) and switch ``model`` to it."""
    AttentionInterface.register(ATTN_NAME, abridge_attention)
    if model.config._attn_implementation != ATTN_NAME:
        model.set_attn_implementation(ATTN_NAME)
