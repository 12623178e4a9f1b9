"""KVzip / KVzip+ scores against a brute-force loop over materialised attention (KVzap paper §3.1-3.2)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_spec
from zoomr.kvzap.pretext import REPEAT_INSTRUCTION, build_repeat_pretext
from zoomr.kvzap.scoring import eager_attention, kvzip_scores
from zoomr.models import load_model_and_tokenizer

TEXT = "The cat sat on the mat. 42 apples, 7 pears; x = y + 1."


@pytest.fixture(scope="module")
def model_tok(cache_dir, tiny_arch):
    """A tiny model whose input norms get random gains: at init (gain 1) ‖h_t‖ = √D for every t,
    which would make the KVzip+ division by ‖h_t‖ untestable."""
    model, tok = load_model_and_tokenizer(tiny_spec(tiny_arch), cache_dir)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in model.model.layers:
            w = layer.input_layernorm.weight
            w.copy_(torch.empty(w.shape).uniform_(0.2, 3.0, generator=gen))
    return model, tok


def brute_force(model, pretext):
    """Independent path: one full forward returning attentions + residual streams, then plain loops."""
    cfg = model.config
    H, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    G, d = H // Hkv, model.model.layers[0].self_attn.head_dim
    (cs, ce), (rs, re) = pretext.context, pretext.repeat
    with torch.no_grad(), eager_attention(model):
        out = model(pretext.input_ids[:, :re], output_attentions=True, output_hidden_states=True)
        zip_, plus = (
            torch.zeros(cfg.num_hidden_layers, Hkv, ce - cs),
            torch.zeros(cfg.num_hidden_layers, Hkv, ce - cs),
        )
        for layer_idx, layer in enumerate(model.model.layers):
            h = layer.input_layernorm(out.hidden_states[layer_idx])[0]  # attention input
            v = layer.self_attn.v_proj(h).view(-1, Hkv, d)
            wo = layer.self_attn.o_proj.weight
            attn = out.attentions[layer_idx][0]
            for kv in range(Hkv):
                for i in range(cs, ce):
                    best_zip = best_plus = 0.0
                    for g in range(kv * G, (kv + 1) * G):
                        wov = torch.linalg.vector_norm(wo[:, g * d : (g + 1) * d] @ v[i, kv]).item()
                        for t in range(rs, re):
                            a = attn[g, t, i].item()
                            best_zip = max(best_zip, a)
                            best_plus = max(best_plus, a * wov / torch.linalg.vector_norm(h[t]).item())
                    zip_[layer_idx, kv, i - cs], plus[layer_idx, kv, i - cs] = best_zip, best_plus
    return zip_, plus, out


def test_pretext_spans_hold_the_context_twice(model_tok):
    _, tok = model_tok
    ctx = tok(TEXT, add_special_tokens=False)["input_ids"]
    p = build_repeat_pretext(tok, ctx)
    ids = p.input_ids[0].tolist()
    assert ids[slice(*p.context)] == ctx and ids[slice(*p.repeat)] == ctx
    between = tok.decode(ids[p.context[1] : p.repeat[0]])
    assert REPEAT_INSTRUCTION.strip() in between and "assistant" in between
    assert "user" in tok.decode(ids[: p.context[0]])


@pytest.mark.parametrize("chunk_size", [5, 1000])
def test_scores_equal_brute_force(model_tok, chunk_size):
    model, tok = model_tok
    pretext = build_repeat_pretext(tok, tok(TEXT, add_special_tokens=False)["input_ids"])
    got = kvzip_scores(model, pretext, chunk_size=chunk_size, keep_hidden=True)
    want_zip, want_plus, out = brute_force(model, pretext)
    torch.testing.assert_close(got.kvzip, want_zip, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got.kvzip_plus, want_plus, rtol=1e-4, atol=1e-7)
    # the stored hidden states are the attention inputs of the context tokens
    cs, ce = pretext.context
    for layer_idx, layer in enumerate(model.model.layers):
        h = layer.input_layernorm(out.hidden_states[layer_idx])[0, cs:ce]
        torch.testing.assert_close(got.hidden[layer_idx], h, rtol=1e-4, atol=1e-5)
    assert model.config._attn_implementation == "sdpa"  # restored
    # KVzip+ is not a per-head rescaling of KVzip (the product sits inside the maxima)
    assert got.kvzip_plus.shape == got.kvzip.shape == (model.config.num_hidden_layers, 2, ce - cs)
    assert bool((got.log() < 0).all()) and bool(torch.isfinite(got.log()).all())


def test_chunking_does_not_change_scores(model_tok):
    model, tok = model_tok
    text = " ".join([TEXT] * 6)
    pretext = build_repeat_pretext(tok, tok(text, add_special_tokens=False)["input_ids"])
    ref = kvzip_scores(model, pretext, chunk_size=10_000)
    for chunk in (1, 17, 64):
        got = kvzip_scores(model, pretext, chunk_size=chunk)
        torch.testing.assert_close(got.kvzip_plus, ref.kvzip_plus, rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(got.kvzip, ref.kvzip, rtol=1e-4, atol=1e-7)
