"""The LightThinker thought mask (METHODS.md "Baselines", LightThinker), on the project's mask machinery.

A token at stream index q sees key kv (kv ≤ q) iff kv is

- a prompt token (never compressed), or
- a raw token (thought text or splitter) of q's own thought, when q is a raw token or a cache token of
  that thought (cache tokens see the prompt, earlier cache tokens and the current thought), or
- a cache or ``<|continue|>`` token of q's thought or an earlier one (the compressed history).

So every token after a thought's cache tokens — its ``<|continue|>`` first — no longer sees that
thought, exactly what serving holds once the thought's and the splitter's KV are freed. The same mask
at every layer. Padding queries see only themselves, padding keys are never seen.

The rule is one FlexAttention ``mask_mod`` over the stream's per-token ``kind`` / ``block`` (thought
index); :func:`zoomr.abridge.mask.build_mask` turns it into a ``BlockMask`` (CUDA) or a dense mask
(SDPA), and :func:`zoomr.abridge.forward.masked_logits` runs the single forward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from zoomr.abridge.data import batch_meta
from zoomr.abridge.forward import masked_logits, per_response_token, token_ce
from zoomr.abridge.layout import PAD, PROMPT, RAW
from zoomr.abridge.mask import TokenMeta, build_mask
from zoomr.lightthinker.layout import CACHE, CONTINUE


def thought_mask_mod(meta: TokenMeta) -> Callable:
    """``mask_mod(b, h, q_idx, kv_idx) -> bool`` of the module docstring."""
    kind, thought = meta.kind, meta.block

    def mask_mod(b, h, q_idx, kv_idx):
        kk, qk = kind[b, kv_idx], kind[b, q_idx]
        kt, qt = thought[b, kv_idx], thought[b, q_idx]
        prompt = kk == PROMPT
        own_thought = (kk == RAW) & (kt == qt) & ((qk == RAW) | (qk == CACHE))
        compressed = ((kk == CACHE) | (kk == CONTINUE)) & (kt <= qt)
        is_pad = qk == PAD
        return ((kv_idx <= q_idx) & ~is_pad & (prompt | own_thought | compressed)) | (
            is_pad & (q_idx == kv_idx)
        )

    return mask_mod


def causal_mask_mod(meta: TokenMeta) -> Callable:
    """Plain causal attention over the stream, thoughts never hidden: the parity test's wrong mask."""
    kind = meta.kind

    def mask_mod(b, h, q_idx, kv_idx):
        is_pad = kind[b, q_idx] == PAD
        return ((kv_idx <= q_idx) & ~is_pad & (kind[b, kv_idx] != PAD)) | (is_pad & (q_idx == kv_idx))

    return mask_mod


MASKS = {"thought": thought_mask_mod, "causal": causal_mask_mod}


def thought_masks(
    batch: dict[str, torch.Tensor], num_layers: int, backend: str = "auto", rule: str = "thought"
):
    """One mask for every layer (``rule``: thought = LightThinker's, causal = the control)."""
    mask = build_mask(MASKS[rule](batch_meta(batch)), batch_meta(batch), backend)
    return [mask] * num_layers


def thought_response_ce(
    model, batch, backend: str = "auto", dtype: torch.dtype = torch.float32, rule: str = "thought"
) -> list[torch.Tensor]:
    """Per-response-token CE (thought, splitter and tail tokens) under the mask, one vector per example."""
    logits = masked_logits(model, batch, thought_masks(batch, model.config.num_hidden_layers, backend, rule))
    return per_response_token(token_ce(logits, batch["labels"], dtype), batch["labels"])


@torch.no_grad()
def splitter_accuracy(model, streams, pad_id: int, splitter: int, backend: str = "auto", batch_size: int = 4):
    """Teacher-forced, under the mask: the share of the data's splitter positions where the model's argmax
    is ``<|splitter|>`` (recall), and the share of its splitter argmaxes that are right (precision)."""
    from zoomr.abridge.data import collate

    device = next(model.parameters()).device
    hits = wanted = predicted = 0
    for i in range(0, len(streams), batch_size):
        batch = {k: v.to(device) for k, v in collate(streams[i : i + batch_size], pad_id).items()}
        logits = masked_logits(model, batch, thought_masks(batch, model.config.num_hidden_layers, backend))
        scored = batch["labels"] != -100
        is_split, says_split = batch["labels"] == splitter, (logits.argmax(-1) == splitter) & scored
        hits += int((is_split & says_split).sum())
        wanted += int(is_split.sum())
        predicted += int(says_split.sum())
    return {"recall": hits / max(1, wanted), "precision": hits / max(1, predicted), "splitters": wanted}
