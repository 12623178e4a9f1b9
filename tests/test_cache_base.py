"""Cache interface invariants: full-KV equivalence, explicit-mask equivalence, exact kept rows, batching."""

from __future__ import annotations

import pytest
import torch
from transformers import AttentionInterface

from tests.conftest import tiny_spec
from zoomr.cache import PagedKV, build_policy
from zoomr.engine import DecodeSettings, generate
from zoomr.models import load_model_and_tokenizer


@pytest.fixture(scope="module")
def tiny2(cache_dir):
    """2-layer tiny qwen2 (fp32), loaded with the policy attention."""
    return load_model_and_tokenizer(
        tiny_spec("qwen2", num_hidden_layers=2), cache_dir, attn_implementation="zoomr"
    )


def teacher_forced_logits(model, cache, ids: torch.Tensor, n_prefill: int) -> torch.Tensor:
    """Prefill ``n_prefill`` tokens, then feed the rest one by one; logits predicting tokens n_prefill.."""
    out = [model(ids[:, :n_prefill], cache=cache, use_cache=True).logits[:, -1:]]
    for t in range(n_prefill, ids.shape[1] - 1):
        pos = torch.tensor([[t]])
        out.append(model(ids[:, t : t + 1], cache=cache, use_cache=True, position_ids=pos).logits)
    return torch.cat(out, 1)


# --------------------------------------------------------------------------------------------- storage


def test_paged_store_append_retain_and_bytes():
    store = PagedKV(batch=2, heads=2, head_dim=4, dtype=torch.float32, device="cpu", page_size=3)
    keys = torch.arange(2 * 2 * 5 * 4, dtype=torch.float32).view(2, 2, 5, 4)
    valid = torch.tensor([[False, False, True, True, True], [True, True, True, True, True]])
    pos = (valid.long().cumsum(1) - 1).clamp_min(0)
    store.append(keys, -keys, pos, pos, valid)
    assert store.n.tolist() == [[3, 3], [5, 5]]  # pads are never stored
    rows = store.rows()
    assert torch.equal(rows.keys[0, 1, :3], keys[0, 1, 2:]) and torch.equal(rows.values[1, 0], -keys[1, 0])
    assert rows.pos[0, 0].tolist() == [0, 1, 2, -1, -1]
    before = store.bytes()
    keep = torch.zeros(2, 2, 5, dtype=torch.bool)
    keep[0, 0, [0, 2]] = True
    keep[1, 1, [1, 3, 4]] = True
    store.retain(keep)
    assert store.n.tolist() == [[2, 0], [0, 3]]
    rows = store.rows()
    assert rows.pos[0, 0, :2].tolist() == [0, 2] and rows.pos[1, 1].tolist() == [1, 3, 4]
    assert torch.equal(rows.keys[1, 1], keys[1, 1, [1, 3, 4]])
    assert store.n_pages == 2 and store.bytes() < before  # rebuilt: 1 page + 1 page, the rest released
    store.append(
        keys[:, :, :1],
        keys[:, :, :1],
        torch.tensor([[9], [9]]),
        torch.tensor([[9], [9]]),
        torch.ones(2, 1, dtype=torch.bool),
    )
    assert store.rows().pos[0, 1, :1].tolist() == [9] and store.n.tolist() == [[3, 1], [1, 4]]


# --------------------------------------------------------------------------------------------- equivalences

BIG = [
    {"policy": "full"},
    {"policy": "offload"},
    {"policy": "h2o", "budget_rows": 600},
    {"policy": "snapkv", "budget_rows": 600},
    {"policy": "rkv", "budget_rows": 600},
    {"policy": "rkv_serving", "budget_rows": 600},
    {"policy": "evict_block", "rule": "attention"},  # block_size 512 > 200 generated rows: nothing completes
    {"policy": "streaming", "budget_rows": 600, "n_sink": 4},
    {"policy": "streaming", "budget_rows": 600, "n_sink": 4, "reposition": True},
]


# every policy on qwen2; on llama / qwen3 the arch-sensitive paths (SDPA, eager weights, re-rotation) in the fast
# suite and every policy under -m slow
ARCH_CASES = (
    [("qwen2", BIG)]
    + [pytest.param(a, [BIG[0], BIG[2], BIG[-1]], id=f"{a}-core") for a in ("llama", "qwen3")]
    + [pytest.param(a, BIG, id=f"{a}-all", marks=pytest.mark.slow) for a in ("llama", "qwen3")]
)


@pytest.mark.parametrize(("arch", "configs"), ARCH_CASES)
def test_budget_covering_everything_equals_full_kv(arch, configs, cache_dir):
    """300-token prefill + 200 decode steps: a policy that never needs to evict gives full-KV logits."""
    model, _ = load_model_and_tokenizer(
        tiny_spec(arch, num_hidden_layers=2), cache_dir, attn_implementation="zoomr"
    )
    ids = torch.randint(0, 4000, (1, 501), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids[:, :-1]).logits[:, 299:]
        for cfg in configs:
            got = teacher_forced_logits(model, build_policy(cfg, model.config), ids, 300)
            assert got.shape == ref.shape
            assert (got - ref).abs().max() <= 1e-5, cfg


@pytest.mark.parametrize(
    ("arch", "window"),
    [("qwen2", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 1}),
     ("qwen3", {"use_sliding_window": True, "sliding_window": 16, "max_window_layers": 0}),
     ("phi3", {"sliding_window": 16})],
)
@pytest.mark.parametrize("method", [None, {"policy": "h2o", "budget_rows": 8}])
def test_a_model_with_sliding_window_layers_is_refused_before_decoding(arch, window, method):
    """The policy attention has no sliding window: full KV on a qwen2 with use_sliding_window=true (or a phi3 with a
    sliding_window) attended past the window and decoded other tokens than model.generate, without a word."""
    from eval.__main__ import check_policy
    from zoomr.models import tiny_config

    config = tiny_config(arch, 512, num_hidden_layers=2, **window)
    model = type("Loaded", (), {"config": config})()  # check_policy reads only the model's config
    with pytest.raises(SystemExit, match=r"sliding_window=16 tokens.*\(attn_implementation 'zoomr'\) has no sliding"):
        check_policy(method, model, None)
    with pytest.raises(ValueError, match="layers \\[1\\] \\(sliding_attention\\)" if arch == "qwen2" else "sliding_window=16"):
        build_policy(method or {"policy": "full"}, config)
    wide = tiny_config(arch, 512, num_hidden_layers=2, **{**window, "sliding_window": 32768})  # >= its positions
    assert build_policy(method or {"policy": "full"}, wide).num_layers == 2


def test_the_masked_trainers_refuse_a_start_model_with_sliding_window_layers(tmp_path, cache_dir):
    """AbridgeKV's and LightThinker's block-mask attention has no sliding window either: a qwen2 start model with
    use_sliding_window=true was fine-tuned as another model (every layer attending past its window), without a
    word; now refused naming the layers and the window, before any run state (the trainers load it first)."""
    from types import SimpleNamespace

    from transformers import AutoModelForCausalLM

    from zoomr.abridge.trainer import load_start_model
    from zoomr.models import ModelSpec, tiny_config
    from zoomr.schemas.checks import SettingsError

    config = tiny_config("qwen2", 512, num_hidden_layers=2, use_sliding_window=True, sliding_window=16,
                         max_window_layers=1)  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "start")
    spec = ModelSpec(name="tiny-qwen2", arch="qwen2", tiny={})  # the config a run names; init_from wins
    with pytest.raises(SettingsError, match=r"layers \[1\] \(sliding_attention\).*sliding_window=16 tokens, and "
                                            r"the masked trainers' block-mask attention has no sliding window"):
        load_start_model(spec, SimpleNamespace(init_from=str(tmp_path / "start")), cache_dir, torch.device("cpu"))


def _explicit_mask_attention(masks):
    """A plain SDPA attention reading a per-layer, per-query-head explicit mask (bool [1, Hq, T, T])."""

    def attn(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        g = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(g, 1), value.repeat_interleave(g, 1)
        m = masks[module.layer_idx]
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=m, scale=scaling)
        return out.transpose(1, 2).contiguous(), None

    return attn


def record_visible(cache):
    """Wrap ``after_attention`` to record, per step and layer, the positions each KV head saw."""
    seen: list[dict[int, torch.Tensor]] = []
    original = cache.after_attention

    def wrapped(layer):
        if layer.idx == 0:
            seen.append({})
        seen[-1][layer.idx] = layer.view.pos.where(layer.view.valid, torch.tensor(-1)).clone()
        original(layer)

    cache.after_attention = wrapped
    return seen


@pytest.mark.parametrize(
    "cfg",
    [
        {"policy": "full"},
        {"policy": "streaming", "budget_rows": 40, "n_sink": 4},
        {"policy": "h2o", "budget_rows": 30},
        {"policy": "snapkv", "budget_rows": 30, "window": 8},
        {"policy": "rkv", "budget_rows": 30, "window": 4, "buffer": 8},
        {"policy": "rkv_serving", "budget_rows": 30, "window": 4, "compact_every": 8},
        {"policy": "evict_block", "rule": "attention", "block_size": 8, "quota": 3},
        {"policy": "offload"},
    ],
    ids=lambda c: c["policy"] + c.get("rule", ""),
)
def test_decode_logits_equal_explicit_mask_forward(tiny2, cfg):
    """Decode logits == one no-cache forward whose per-layer/head mask lets query t see exactly the rows the
    policy held at step t (pins RoPE positions and the ragged mask)."""
    model, _ = tiny2
    n_prefill, T = 60, 100
    ids = torch.randint(0, 4000, (1, T), generator=torch.Generator().manual_seed(1))
    cache = build_policy(cfg, model.config)
    seen = record_visible(cache)
    with torch.no_grad():
        got = teacher_forced_logits(model, cache, ids, n_prefill)
    L, Hkv, Hq = cache.num_layers, cache.kv_heads, cache.q_heads
    masks = []
    for layer in range(L):
        m = torch.tril(torch.ones(T, T, dtype=torch.bool)).repeat(Hq, 1, 1)  # prefill rows: causal
        for step, t in enumerate(range(n_prefill, T - 1)):
            pos = seen[step + 1][layer][0]  # [Hkv, N] positions visible at query t
            m[:, t] = False
            for h in range(Hq):
                p = pos[h // (Hq // Hkv)]
                m[h, t, p[p >= 0]] = True
        masks.append(m[None])
    AttentionInterface.register("explicit_mask_test", _explicit_mask_attention(masks))
    model.set_attn_implementation("explicit_mask_test")
    try:
        with torch.no_grad():
            ref = model(ids).logits[:, n_prefill - 1 : T - 1]
    finally:
        model.set_attn_implementation("zoomr")
    assert (got - ref).abs().max() <= 1e-5
    if cfg["policy"] == "streaming":
        assert max(int((s[0][0] >= 0).sum(-1).max()) for s in seen[1:]) == 41  # budget + the current token


# --------------------------------------------------------------------------------------------- kept rows


def test_streaming_keeps_sinks_and_window_exactly(tiny2):
    model, _ = tiny2
    cache = build_policy({"policy": "streaming", "budget_rows": 10, "n_sink": 3}, model.config)
    ids = torch.randint(0, 4000, (1, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        teacher_forced_logits(model, cache, ids, 20)  # prefill 20, then feed tokens 20..28
    expected = [0, 1, 2, *range(22, 29)]
    for layer in cache.layers:
        rows = layer.store.rows()
        for h in range(cache.kv_heads):
            assert rows.pos[0, h].tolist() == expected
    assert cache.resident_rows().unique().tolist() == [10]
    assert cache.get_seq_length() == 29  # logical length, not the 10 rows held


def test_streaming_reposition_moves_keys_inside_the_cache(tiny2):
    model, _ = tiny2
    cache = build_policy(
        {"policy": "streaming", "budget_rows": 8, "n_sink": 2, "reposition": True}, model.config
    )
    ids = torch.randint(0, 4000, (1, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        model(ids[:, :12], cache=cache, use_cache=True)
        assert cache.layers[0].store.rows().pos[0, 0].tolist() == list(range(8))
        assert cache.next_positions(torch.ones(1, 1, dtype=torch.bool)).tolist() == [[8]]


# --------------------------------------------------------------------------------------------- batching


@pytest.mark.parametrize(
    "cfg",
    [
        {"policy": "full"},
        {"policy": "streaming", "budget_rows": 12, "n_sink": 2},
        {"policy": "h2o", "budget_rows": 10},
        {"policy": "rkv", "budget_rows": 12, "window": 4, "buffer": 4},
        {"policy": "evict_block", "rule": "random", "block_size": 8, "quota": 2},
        {"policy": "offload"},
    ],
    ids=lambda c: c["policy"] + c.get("rule", ""),
)
def test_left_padded_batch_equals_single_runs(tiny2, cfg):
    model, tok = tiny2
    prompts = [
        "The quick brown fox jumps over",
        "Hello",
        "A long prompt about many things that go on and on",
        "x y z",
    ]
    s = DecodeSettings(max_new_tokens=30, progress=False, stop_token_ids=[])
    batch = generate(model, tok, prompts, cfg, s)
    for p, out in zip(prompts, batch):
        single = generate(model, tok, [p], cfg, s)[0]
        assert out.token_ids == single.token_ids
        assert out.n_tokens == 30 and out.hit_cap


def test_engine_matches_stock_generate_batch1(tiny2):
    """Our loop and ``model.generate(cache=policy)`` agree (greedy, batch 1), with and without eviction."""
    model, tok = tiny2
    ids = tok("Once upon a time there was", return_tensors="pt").input_ids
    for cfg in ({"policy": "full"}, {"policy": "streaming", "budget_rows": 9, "n_sink": 2}):
        ours = generate(
            model,
            tok,
            [ids[0].tolist()],
            cfg,
            DecodeSettings(max_new_tokens=25, progress=False, stop_token_ids=[]),
        )
        stock = model.generate(
            ids, cache=build_policy(cfg, model.config), max_new_tokens=25, min_new_tokens=25, do_sample=False
        )
        assert stock[0, ids.shape[1] :].tolist() == ours[0].token_ids


def test_running_without_the_policy_attention_fails_loudly(cache_dir):
    model, _ = load_model_and_tokenizer(tiny_spec("qwen2", num_hidden_layers=2), cache_dir)  # plain SDPA
    cache = build_policy({"policy": "streaming", "budget_rows": 8}, model.config)
    ids = torch.randint(0, 4000, (1, 12))
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)
        with pytest.raises(RuntimeError, match="attn_implementation='zoomr'"):
            model(ids[:, :1], cache=cache, use_cache=True)


def test_stock_generate_refuses_padded_batches(tiny2):
    model, tok = tiny2
    tok.padding_side = "left"
    enc = tok(["a much longer prompt than the other", "short"], return_tensors="pt", padding=True)
    with pytest.raises(NotImplementedError, match="zoomr.engine.generate"):
        model.generate(**enc, cache=build_policy({"policy": "full"}, model.config), max_new_tokens=3)
