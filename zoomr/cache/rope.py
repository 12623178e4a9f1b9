"""RoPE helpers for policies that move kept keys to new positions (StreamingLLM's in-cache re-rotation)."""

from __future__ import annotations

from typing import Any

import torch


def rope_inv_freq(model_config: Any, head_dim: int) -> torch.Tensor:
    """Inverse frequencies of the model's rotary embedding (``[head_dim // 2]``, float32)."""
    params = dict(getattr(model_config, "rope_parameters", None) or {})
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        base = params.get("rope_theta", getattr(model_config, "rope_theta", 10000.0))
        dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
        return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv_freq, _ = ROPE_INIT_FUNCTIONS[rope_type](model_config, "cpu")
    return inv_freq.float()


def rotate(keys: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Move post-RoPE ``keys [..., d]`` by ``delta [...]`` positions: R(p + delta) k = R(delta) R(p) k.

    A pure rotation (no attention scaling), so it composes exactly with the model's own RoPE.
    """
    dtype, keys = keys.dtype, keys.float()  # rotate in fp32: repeated re-rotations must not drift
    freqs = delta.to(torch.float32)[..., None] * inv_freq.to(keys.device)
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    rot = keys[..., : emb.shape[-1]]
    half = rot.shape[-1] // 2
    rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    out = rot * cos + rotated * sin
    if emb.shape[-1] < keys.shape[-1]:
        out = torch.cat([out, keys[..., emb.shape[-1] :]], dim=-1)
    return out.to(dtype)
