"""The engine's direct decoder forward gives the model's own logits, and steps aside where it would not."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_spec
from zoomr.cache import build_policy
from zoomr.decode_forward import DecoderForward, direct_path_reason
from zoomr.engine import DecodeSettings, generate
from zoomr.models import load_model_and_tokenizer


@pytest.fixture(scope="module")
def models(cache_dir):
    overrides = {"phi3": {"partial_rotary_factor": 0.5}}  # RoPE on half of each head's dims
    return {
        arch: load_model_and_tokenizer(
            tiny_spec(arch, num_hidden_layers=2, **overrides.get(arch, {})), cache_dir, attn_implementation="zoomr"
        )
        for arch in ("qwen2", "llama", "qwen3", "phi3")
    }


def _steps(model, forward, policy: str):
    """Logits of a padded two-sequence prefill and three decode steps through a fresh ``policy`` cache."""
    cache = build_policy({"policy": policy, "budget_rows": 12} if policy != "full" else {"policy": "full"}, model.config)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 500, (2, 16), generator=gen)
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[1, :5] = False  # left padding: the second sequence's positions start at 0 after the pads
    out = []
    step = cache.begin_step(valid, input_ids=ids, is_prefill=True, ends_prefill=True)
    out.append(forward(ids, step.positions, cache))
    cache.end_step()
    tok = out[-1][:, -1:].argmax(-1)
    for _ in range(3):
        step = cache.begin_step(torch.ones_like(tok, dtype=torch.bool), input_ids=tok)
        out.append(forward(tok, step.positions, cache, True))
        cache.end_step()
        tok = out[-1][:, -1:].argmax(-1)
    return out


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3", "phi3"])
@pytest.mark.parametrize("policy", ["full", "h2o"])
@torch.no_grad()
def test_direct_forward_gives_the_models_logits(models, arch, policy):
    model, _ = models[arch]
    assert direct_path_reason(model) is None
    direct = DecoderForward(model)

    def through_model(ids, positions, cache, keep_last=False):
        kwargs = {"logits_to_keep": 1} if keep_last else {}
        return model(input_ids=ids, position_ids=positions, cache=cache, use_cache=True, **kwargs).logits

    for ours, theirs in zip(_steps(model, direct, policy), _steps(model, through_model, policy)):
        assert ours.shape == theirs.shape
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    assert direct._cos is not None and direct._cos.shape[0] >= 1024  # the table, filled once


@torch.no_grad()
def test_rope_table_grows_past_its_first_size(models):
    model, _ = models["llama"]
    direct = DecoderForward(model)
    like = torch.zeros(1, 1, model.config.hidden_size)
    positions = torch.tensor([[3, 2500]])
    cos, sin = direct._rope(positions, like)
    ref_cos, ref_sin = model.model.rotary_emb(like, positions)
    assert direct._cos.shape[0] >= 2501
    torch.testing.assert_close(cos, ref_cos, rtol=0, atol=0)
    torch.testing.assert_close(sin, ref_sin, rtol=0, atol=0)


@torch.no_grad()
def test_a_hook_on_the_model_sends_the_step_through_model_call(models):
    model, tok = models["qwen2"]
    seen = []
    handle = model.register_forward_hook(lambda mod, inp, out: seen.append(out.logits.shape))
    try:
        assert "hooks" in direct_path_reason(model)
        settings = DecodeSettings(max_new_tokens=4, stop_token_ids=[], progress=False)
        hooked = generate(model, tok, [[7, 8, 9, 10]], {"policy": "full"}, settings)[0].token_ids
    finally:
        handle.remove()
    assert len(seen) == 4  # the prefill and three decode steps, each through model(...)
    direct = generate(model, tok, [[7, 8, 9, 10]], {"policy": "full"}, settings)[0].token_ids
    assert direct == hooked


def test_models_it_cannot_drive_exactly_are_named(models):
    model, _ = models["qwen2"]
    original = model.config.layer_types
    model.config.layer_types = ["sliding_attention"] + list(original[1:])
    try:
        assert direct_path_reason(model) == "sliding-window layers"
    finally:
        model.config.layer_types = original
    phi3, _ = models["phi3"]
    phi3.config.sliding_window = 64
    try:
        assert direct_path_reason(phi3) == "sliding-window attention"
    finally:
        phi3.config.sliding_window = None
    rope = model.model.rotary_emb
    original_type = rope.rope_type
    rope.rope_type = "dynamic"
    try:
        assert "rescales" in direct_path_reason(model)
    finally:
        rope.rope_type = original_type
