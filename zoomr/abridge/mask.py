"""The AbridgeKV block mask (AbridgeKV §3, Eq. 2; METHODS.md "AbridgeKV"), one per layer quota.

A token at stream index q sees key kv (kv ≤ q) iff kv is

- a prompt token (the prompt is never compressed), or
- a raw or pause token of q's own block (raw tokens causally; a pause token sees its block's raw tokens
  and the block's earlier pause tokens, all K of them: they are computed together in serving), or
- one of the first ``quota`` code rows (pause slots) of an earlier, completed block.

So nothing after a block's code rows sees that block's raw tokens, and at layer ℓ rows beyond q_ℓ are
masked. Padding queries see only themselves (no empty softmax row); padding keys are never seen.

The predicate is written once, as a FlexAttention ``mask_mod`` over per-token metadata, and has three
back ends behind :func:`layer_masks`: a FlexAttention ``BlockMask`` (CUDA; FlexAttention has no CPU
backward), a dense boolean ``[B, 1, S, S]`` mask for SDPA, obtained by evaluating the same ``mask_mod``
on broadcast index grids, and :class:`ChunkedMask` (CPU default): the dense mask's rows in chunks of
consecutive queries, each chunk attending only over the keys some query of it sees. The block mask is
sparse (a token sees the prompt, its own block and q code rows per earlier block), so SDPA over the
gathered keys does a fraction of the dense work, with the same allowed pairs: the same loss.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from zoomr.abridge.layout import PAD, PAUSE, PROMPT, RAW
from zoomr.schemas.abridge import MASK_BACKENDS as BACKENDS

CHUNK = 64  # queries per chunk of the chunked back end (one AbridgeKV testbed block; 32-128 time alike on CPU)


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


@dataclass
class ChunkedMask:
    """A mask as key lists per chunk of ``chunk`` consecutive queries: chunk ``c`` of row ``b`` attends over
    the keys ``kv_index[b, c]`` (the union of what its queries see, in stream order, padded to the longest
    union), query ``i`` of it to those where ``allowed[b·n + c, 0, i]``. Queries past the stream's end see
    key 0 only (a finite softmax; their outputs are dropped)."""

    chunk: int
    length: int
    kv_index: torch.Tensor  # [B, n_chunks, W] long
    allowed: torch.Tensor  # [B * n_chunks, 1, chunk, W] bool

    @property
    def width(self) -> int:
        return self.kv_index.shape[-1]


def chunked_mask(mask_mod: Callable, batch: int, length: int, device: torch.device, chunk: int | None = None) -> ChunkedMask:
    """The same ``mask_mod`` as a :class:`ChunkedMask` (exact: its allowed pairs are the dense mask's)."""
    chunk = chunk or CHUNK
    dense = dense_mask(mask_mod, batch, length, device)[:, 0]
    n = -(-length // chunk)
    rows = torch.nn.functional.pad(dense, (0, 0, 0, n * chunk - length)).view(batch, n, chunk, length)
    union = rows.any(2)  # [B, n, S]: keys some query of the chunk sees
    width = int(union.sum(-1).max())
    # a stable sort of "not seen" puts the seen keys first, in stream order
    kv_index = torch.sort((~union).to(torch.uint8), dim=-1, stable=True).indices[..., :width].contiguous()
    allowed = torch.gather(rows, 3, kv_index[:, :, None, :].expand(-1, -1, chunk, -1))
    allowed[..., 0] |= ~allowed.any(-1)
    return ChunkedMask(chunk, length, kv_index, allowed.view(batch * n, 1, chunk, width))


def resolve_backend(backend: str, device: torch.device) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"mask backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "flex" if device.type == "cuda" else "chunked"
    return backend


def build_mask(mask_mod: Callable, meta: TokenMeta, backend: str = "auto"):
    """The single mask builder: any ``mask_mod`` over ``meta``'s batch as a dense boolean ``[B, 1, S, S]``
    mask (SDPA), a :class:`ChunkedMask` (SDPA over gathered keys) or a FlexAttention ``BlockMask``.

    ``backend``: ``dense``, ``chunked``, ``flex`` or ``auto`` (flex on CUDA, chunked elsewhere).
    LightThinker's thought mask (:mod:`zoomr.lightthinker.mask`) is built here too.
    """
    device = meta.kind.device
    build = {"flex": flex_block_mask, "dense": dense_mask, "chunked": chunked_mask}[resolve_backend(backend, device)]
    batch, length = meta.shape
    return build(mask_mod, batch, length, device)


def layer_masks(meta: TokenMeta, quotas: Sequence[int], backend: str = "auto") -> list:
    """One AbridgeKV mask per layer (shared between layers of equal quota), see :func:`build_mask`."""
    built = {q: build_mask(abridge_mask_mod(meta, int(q)), meta, backend) for q in sorted(set(quotas))}
    return [built[q] for q in quotas]
