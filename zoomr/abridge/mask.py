"""The AbridgeKV block mask (AbridgeKV §3, Eq. 2; METHODS.md "AbridgeKV"), one per layer quota.

A token at stream index q sees key kv (kv ≤ q) iff kv is

- a prompt token (the prompt is never compressed), or
- a raw or pause token of q's own block (raw tokens causally; a pause token sees its block's raw tokens
  and the block's earlier pause tokens, all K of them: they are computed together in serving), or
- one of the first ``quota`` code rows (pause slots) of an earlier, completed block.

So nothing after a block's code rows sees that block's raw tokens, and at layer ℓ rows beyond q_ℓ are
masked. Padding queries see only themselves (no empty softmax row); padding keys are never seen.

The predicate is written once, as a FlexAttention ``mask_mod`` over per-token metadata, and has two
back ends behind :func:`layer_masks`: a FlexAttention ``BlockMask`` (CUDA; FlexAttention has no CPU
backward) and a dense boolean ``[B, 1, S, S]`` mask for SDPA, obtained by evaluating the same
``mask_mod`` on broadcast index grids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from zoomr.abridge.layout import PAD, PAUSE, PROMPT, RAW

BACKENDS = ("auto", "dense", "flex")


@dataclass
class TokenMeta:
    """Per-token ``kind`` / ``block`` / ``slot`` of a padded batch, each ``[B, S]`` long (see layout.Stream)."""

    kind: torch.Tensor
    block: torch.Tensor
    slot: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.kind.shape)  # type: ignore[return-value]


def abridge_mask_mod(meta: TokenMeta, quota: int) -> Callable:
    """``mask_mod(b, h, q_idx, kv_idx) -> bool`` of the module docstring for one layer quota."""
    kind, block, slot = meta.kind, meta.block, meta.slot

    def mask_mod(b, h, q_idx, kv_idx):
        kk, qk = kind[b, kv_idx], kind[b, q_idx]
        kb, qb = block[b, kv_idx], block[b, q_idx]
        prompt = kk == PROMPT
        own_block = (kb == qb) & (kk >= RAW)
        code = (kk == PAUSE) & (kb < qb) & (slot[b, kv_idx] < quota)
        is_pad = qk == PAD
        return ((kv_idx <= q_idx) & ~is_pad & (prompt | own_block | code)) | (is_pad & (q_idx == kv_idx))

    return mask_mod


def dense_mask(mask_mod: Callable, batch: int, length: int, device: torch.device) -> torch.Tensor:
    """Evaluate a ``mask_mod`` on broadcast index grids: boolean ``[B, 1, S, S]`` (True = attend)."""
    b = torch.arange(batch, device=device).view(batch, 1, 1, 1)
    h = torch.zeros(1, 1, 1, 1, dtype=torch.long, device=device)
    q = torch.arange(length, device=device).view(1, 1, length, 1)
    kv = torch.arange(length, device=device).view(1, 1, 1, length)
    return mask_mod(b, h, q, kv).expand(batch, 1, length, length)


def flex_block_mask(mask_mod: Callable, batch: int, length: int, device: torch.device):
    """The same ``mask_mod`` as a FlexAttention ``BlockMask`` (sparse over 128×128 tiles).

    Compiled on CUDA, so long sequences never materialise the dense ``S × S`` mask.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    compile_ = torch.device(device).type == "cuda"
    return create_block_mask(mask_mod, batch, None, length, length, device=str(device), _compile=compile_)


def resolve_backend(backend: str, device: torch.device) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"mask backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "flex" if device.type == "cuda" else "dense"
    return backend


def build_mask(mask_mod: Callable, meta: TokenMeta, backend: str = "auto"):
    """The single mask builder: any ``mask_mod`` over ``meta``'s batch as a dense boolean ``[B, 1, S, S]``
    mask (SDPA) or a FlexAttention ``BlockMask``.

    ``backend``: ``dense``, ``flex`` or ``auto`` (flex on CUDA, dense elsewhere). LightThinker's thought
    mask (:mod:`zoomr.lightthinker.mask`) is built here too.
    """
    device = meta.kind.device
    build = flex_block_mask if resolve_backend(backend, device) == "flex" else dense_mask
    batch, length = meta.shape
    return build(mask_mod, batch, length, device)


def layer_masks(meta: TokenMeta, quotas: Sequence[int], backend: str = "auto") -> list:
    """One AbridgeKV mask per layer (shared between layers of equal quota), see :func:`build_mask`."""
    built = {q: build_mask(abridge_mask_mod(meta, int(q)), meta, backend) for q in sorted(set(quotas))}
    return [built[q] for q in quotas]
