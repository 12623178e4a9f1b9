"""The trainer's single forward pass under the block mask, and per-token cross-entropy (AbridgeKV Eq. 2).

Loss = next-token CE on every response token (``labels != -100``), none on pause tokens, no auxiliary
terms. :func:`full_kv_response_ce` scores the same responses with ordinary causal attention and no
pause tokens (the same weights with the whole history resident): the full-KV reference.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F

from zoomr.abridge.attention import ATTN_NAME, use_abridge_attention
from zoomr.abridge.data import batch_meta
from zoomr.abridge.layout import IGNORE, PROMPT, RAW
from zoomr.abridge.mask import layer_masks


@contextlib.contextmanager
def abridge_attention(model) -> Iterator[None]:
    """Switch ``model`` to the per-layer-mask attention function for the block, then restore."""
    before = model.config._attn_implementation
    use_abridge_attention(model)
    try:
        yield
    finally:
        if before != ATTN_NAME:
            model.set_attn_implementation(before)


def stream_logits(model, batch: dict[str, torch.Tensor], quotas: Sequence[int], backend: str = "auto"):
    """Logits of one forward over the interleaved streams, each layer under its own quota's mask."""
    if len(quotas) != model.config.num_hidden_layers:
        raise ValueError(f"{len(quotas)} quotas for a model with {model.config.num_hidden_layers} layers")
    return masked_logits(model, batch, layer_masks(batch_meta(batch), quotas, backend))


def masked_logits(model, batch: dict[str, torch.Tensor], masks: Sequence) -> torch.Tensor:
    """Logits of one forward over ``batch`` with ``masks[ℓ]`` (dense or ``BlockMask``) at layer ℓ."""
    if len(masks) != model.config.num_hidden_layers:
        raise ValueError(f"{len(masks)} masks for a model with {model.config.num_hidden_layers} layers")
    with abridge_attention(model):
        out = model(
            input_ids=batch["input_ids"],
            position_ids=batch["position_ids"],
            abridge_masks=list(masks),
            use_cache=False,
        )
    return out.logits


def token_ce(logits: torch.Tensor, labels: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``[B, S]`` CE of predicting ``labels`` at each position (0 where ignored), computed in ``dtype``.

    fp32 loses ~1e-5 nats to cancellation (logsumexp − logit) on confident tokens of a trained model:
    parity checks use float64.
    """
    ce = F.cross_entropy(logits.to(dtype).transpose(1, 2), labels.clamp_min(0), reduction="none")
    return ce * (labels != IGNORE)


def per_response_token(ce: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
    """Row-wise CE of the labelled positions, in response order (one vector per example)."""
    return [row[lab != IGNORE] for row, lab in zip(ce, labels)]


def stream_response_ce(
    model, batch, quotas: Sequence[int], backend: str = "auto", dtype: torch.dtype = torch.float32
) -> list[torch.Tensor]:
    """Per-response-token CE under the block mask, one vector per example."""
    logits = stream_logits(model, batch, quotas, backend)
    return per_response_token(token_ce(logits, batch["labels"], dtype), batch["labels"])


@torch.no_grad()
def full_kv_response_ce(
    model, batch: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32
) -> list[torch.Tensor]:
    """Per-response-token CE with plain causal attention over prompt + raw response (pause tokens, and any
    other compression token such as LightThinker's cache and continue tokens, removed), on the same
    targets as the stream's labels (a token carries loss iff the stream token before it has a label)."""
    out = []
    for ids, kind, stream_labels in zip(batch["input_ids"], batch["kind"], batch["labels"]):
        scored = torch.zeros_like(kind, dtype=torch.bool)  # tokens whose prediction carries loss
        scored[1:] = stream_labels[:-1] != IGNORE
        keep = (kind == PROMPT) | (kind == RAW)
        ids, scored = ids[keep][None], scored[keep]
        labels = torch.full_like(ids, IGNORE)
        labels[0, :-1] = torch.where(scored[1:], ids[0, 1:], IGNORE)
        logits = model(
            input_ids=ids, position_ids=torch.arange(ids.shape[1])[None].to(ids), use_cache=False
        ).logits
        out += per_response_token(token_ce(logits, labels, dtype), labels)
    return out


@torch.no_grad()
def mean_ce(vectors: list[torch.Tensor]) -> float:
    """Token-weighted mean of per-response-token CE vectors."""
    total = sum(float(v.sum()) for v in vectors)
    return total / max(1, sum(v.numel() for v in vectors))


@torch.no_grad()
def heldout_ce(
    model, streams, quotas: Sequence[int], pad_id: int, batch_size: int = 4, backend: str = "auto"
) -> float:
    """Held-out response CE under the block mask (the allocation probe's metric)."""
    return heldout_masked_ce(
        model, streams, pad_id, lambda b: layer_masks(batch_meta(b), quotas, backend), batch_size
    )


@torch.no_grad()
def heldout_masked_ce(model, streams, pad_id: int, make_masks: Callable, batch_size: int = 4) -> float:
    """Held-out response CE, each batch under ``make_masks(batch)`` (one mask per layer)."""
    from zoomr.abridge.data import collate

    device = next(model.parameters()).device
    vectors: list[torch.Tensor] = []
    for i in range(0, len(streams), batch_size):
        batch = {k: v.to(device) for k, v in collate(streams[i : i + batch_size], pad_id).items()}
        logits = masked_logits(model, batch, make_masks(batch))
        vectors += per_response_token(token_ce(logits, batch["labels"]), batch["labels"])
    return mean_ce(vectors)


@torch.no_grad()
def heldout_full_kv_ce(model, streams, pad_id: int) -> float:
    """Held-out response CE of the same weights with the whole history resident (no pauses)."""
    from zoomr.abridge.data import collate

    device = next(model.parameters()).device
    vectors: list[torch.Tensor] = []
    for s in streams:
        vectors += full_kv_response_ce(model, {k: v.to(device) for k, v in collate([s], pad_id).items()})
    return mean_ce(vectors)
