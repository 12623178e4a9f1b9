"""The AbridgeKV block mask: a brute-force reference, both back ends, and leak tests on a tiny model."""

from __future__ import annotations

import pytest
import torch

from zoomr.abridge.data import batch_meta, collate
from zoomr.abridge.forward import full_kv_response_ce, stream_logits, stream_response_ce
from zoomr.abridge.layout import PAD, PAUSE, PROMPT, RAW, AbridgeLayout, interleave, pause_token_ids
from zoomr.abridge.mask import ChunkedMask, abridge_mask_mod, chunked_mask, layer_masks

LAYOUT = AbridgeLayout(block_size=8, num_pause=4)


def _reference_visible(s, q: int, kv: int, quota: int) -> bool:
    """The rule in words, token by token, from the stream lists (independent of the mask_mod)."""
    if kv > q:
        return False
    if s.kind[kv] == PROMPT:
        return True
    if s.block[kv] == s.block[q]:
        return s.kind[q] in (RAW, PAUSE)
    return s.kind[kv] == PAUSE and s.block[kv] < s.block[q] and s.slot[kv] < quota


def _streams(tok, lengths=(30, 13), seed=0):
    g = torch.Generator().manual_seed(seed)
    pauses = pause_token_ids(tok, LAYOUT.num_pause)
    return [
        interleave(
            torch.randint(0, 4000, (5,), generator=g).tolist(),
            torch.randint(0, 4000, (n,), generator=g).tolist(),
            LAYOUT,
            pauses,
        )
        for n in lengths
    ]


@pytest.fixture(scope="module")
def model_tok(tiny_model_and_tokenizer):
    return tiny_model_and_tokenizer


def test_dense_mask_matches_the_rule_token_by_token(model_tok):
    _, tok = model_tok
    streams = _streams(tok)
    batch = collate(streams, pad_id=0)
    quotas = [0, 2, 4, 2]
    masks = layer_masks(batch_meta(batch), quotas, backend="dense")
    assert masks[1] is masks[3]  # one mask per distinct quota
    length = batch["input_ids"].shape[1]
    for layer, quota in enumerate(quotas):
        for b, s in enumerate(streams):
            for q in range(length):
                for kv in range(length):
                    got = bool(masks[layer][b, 0, q, kv])
                    if q >= len(s):  # padding query: itself only
                        assert got == (q == kv)
                    elif kv >= len(s):
                        assert not got
                    else:
                        assert got == _reference_visible(s, q, kv, quota), (layer, b, q, kv)
    assert (batch["kind"][1, len(streams[1]) :] == PAD).all()


@torch.no_grad()
def test_flex_and_dense_backends_give_the_same_loss_on_cpu(model_tok):
    model, tok = model_tok
    batch = collate(_streams(tok, (40, 27)), pad_id=0)
    quotas = [1, 4, 2, 3]
    dense = torch.cat(stream_response_ce(model, batch, quotas, backend="dense"))
    flex = torch.cat(stream_response_ce(model, batch, quotas, backend="flex"))
    assert dense.numel() == 40 + 27
    assert (dense - flex).abs().max() < 1e-4, (dense - flex).abs().max()
    assert model.config._attn_implementation == "sdpa"  # restored after the masked forward


def _scatter(mask: ChunkedMask, batch: int) -> torch.Tensor:
    """A chunked mask's allowed pairs back as a dense ``[B, S, S]`` mask (rows past the end dropped)."""
    n = mask.kv_index.shape[1]
    allowed = mask.allowed.view(batch, n, mask.chunk, mask.width)
    index = mask.kv_index[:, :, None, :].expand(-1, -1, mask.chunk, -1)  # distinct keys per chunk
    dense = torch.zeros(batch, n, mask.chunk, mask.length, dtype=torch.bool).scatter_(3, index, allowed)
    return dense.view(batch, n * mask.chunk, mask.length)[:, : mask.length]


@pytest.mark.parametrize("chunk", [5, 16, 64])
def test_chunked_mask_holds_exactly_the_dense_masks_pairs(model_tok, chunk):
    _, tok = model_tok
    batch = collate(_streams(tok, (40, 27)), pad_id=0)
    meta, length = batch_meta(batch), batch["input_ids"].shape[1]
    for quota in (0, 2, 4):
        dense = layer_masks(meta, [quota], backend="dense")[0][:, 0]
        mask = chunked_mask(abridge_mask_mod(meta, quota), 2, length, meta.kind.device, chunk)
        assert torch.equal(_scatter(mask, 2), dense), quota
        # each chunk gathers only keys some query of it sees (fewer than the stream once there are 2+ chunks),
        # in stream order
        n_chunks = mask.kv_index.shape[1]
        assert n_chunks == -(-length // chunk) and (n_chunks == 1 or mask.width < length)
        seen = mask.allowed.view(2, n_chunks, chunk, mask.width).any(2)
        assert (mask.kv_index.diff(dim=-1)[seen[..., 1:]] > 0).all()


def test_chunked_backend_gives_the_dense_loss_and_gradients(model_tok):
    model, tok = model_tok
    batch = collate(_streams(tok, (40, 27)), pad_id=0)
    quotas = [1, 4, 2, 3]
    grads = {}
    for backend in ("dense", "chunked"):
        model.zero_grad()
        ce = stream_response_ce(model, batch, quotas, backend=backend, dtype=torch.float64)
        torch.cat(ce).sum().backward()
        grads[backend] = (torch.cat(ce).detach(), [p.grad.clone() for p in model.parameters()])
    model.zero_grad()
    (ce_d, g_d), (ce_c, g_c) = grads["dense"], grads["chunked"]
    assert ce_d.numel() == 40 + 27
    assert (ce_d - ce_c).abs().max() < 1e-5
    assert max((a - b).abs().max().item() for a, b in zip(g_d, g_c)) < 1e-5
    assert max(g.abs().max().item() for g in g_d) > 1e-2  # the gradients compared are not all zero


def test_auto_backend_is_chunked_on_cpu_and_flex_on_cuda():
    from zoomr.abridge.mask import resolve_backend

    assert resolve_backend("auto", torch.device("cpu")) == "chunked"
    assert resolve_backend("auto", torch.device("cuda")) == "flex"
    with pytest.raises(ValueError, match="mask backend must be one of"):
        resolve_backend("sparse", torch.device("cpu"))


@torch.no_grad()
def test_without_a_completed_block_the_stream_is_plain_causal(model_tok):
    model, tok = model_tok
    batch = collate(_streams(tok, (8, 5)), pad_id=0)  # no block is followed by more tokens: no pauses
    assert not (batch["kind"] == PAUSE).any()
    masked = torch.cat(stream_response_ce(model, batch, [0, 0, 0, 0], "dense"))
    full = torch.cat(full_kv_response_ce(model, batch))
    assert (masked - full).abs().max() < 1e-5


def _later_block_logits(model, batch, quotas, backend="dense"):
    logits = stream_logits(model, batch, quotas, backend)[0]
    later = (batch["block"][0] >= 1) & (batch["kind"][0] == RAW)
    return logits[later]


@torch.no_grad()
@pytest.mark.parametrize("backend", ["dense", "chunked"])
def test_no_leak_from_compressed_raw_tokens(model_tok, backend):
    """With quota 0, later blocks cannot depend on block 0's raw tokens; with quota 4 they do."""
    model, tok = model_tok
    s = _streams(tok, (30,))[0]
    batch = collate([s], pad_id=0)
    changed = {k: v.clone() for k, v in batch.items()}
    block0_raw = (batch["block"][0] == 0) & (batch["kind"][0] == RAW)
    changed["input_ids"][0, block0_raw] = (batch["input_ids"][0, block0_raw] + 17) % 4000
    for quota, should_change in [(0, False), (4, True)]:
        a = _later_block_logits(model, batch, [quota] * 4, backend)
        b = _later_block_logits(model, changed, [quota] * 4, backend)
        diff = (a - b).abs().max().item()
        assert (diff > 1e-3) if should_change else (diff < 1e-5), (quota, diff)


@torch.no_grad()
@pytest.mark.parametrize("backend", ["dense", "chunked"])
def test_code_rows_beyond_the_quota_are_invisible_to_later_blocks(model_tok, backend):
    """Swap the token of pause slot j: later raw tokens change iff j < quota (here quota 2)."""
    model, tok = model_tok
    s = _streams(tok, (30,))[0]
    batch = collate([s], pad_id=0)
    for slot, should_change in [(3, False), (2, False), (1, True)]:
        changed = {k: v.clone() for k, v in batch.items()}
        where = (batch["kind"][0] == PAUSE) & (batch["slot"][0] == slot)
        changed["input_ids"][0, where] = 42
        diff = (
            (_later_block_logits(model, batch, [2] * 4, backend) - _later_block_logits(model, changed, [2] * 4, backend))
            .abs()
            .max()
        )
        assert (diff > 1e-3) if should_change else (diff < 1e-5), (slot, diff)
