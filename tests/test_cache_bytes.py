"""Reported bytes are the bytes of the tensors a policy holds; evicting really frees memory."""

from __future__ import annotations

import gc

import pytest
import torch

from tests.conftest import tiny_spec
from zoomr.cache import build_policy
from zoomr.engine import DecodeSettings, generate
from zoomr.memory import full_kv_bytes, kv_bytes_per_token
from zoomr.models import load_model_and_tokenizer


@pytest.fixture(scope="module")
def tiny2(cache_dir):
    return load_model_and_tokenizer(
        tiny_spec("qwen2", num_hidden_layers=2), cache_dir, attn_implementation="zoomr"
    )


def gc_tensor_bytes(cache) -> int:
    """Independent count: every tensor reachable through the garbage collector's referents from the cache's
    state (not its tokenizer / model config), distinct storages once."""
    skip = {id(getattr(cache, a, None)) for a in ("tokenizer", "model_config", "config")}
    seen, storages, stack = set(), {}, [v for k, v in vars(cache).items() if id(v) not in skip]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            st = obj.untyped_storage()
            storages[(str(obj.device), st.data_ptr())] = st.nbytes()
        elif isinstance(obj, (dict, list, tuple, set)) or type(obj).__module__.startswith("zoomr"):
            stack.extend(gc.get_referents(obj))
    return sum(storages.values())


@pytest.mark.parametrize(
    "cfg",
    [
        {"policy": "full"},
        {"policy": "streaming", "budget_rows": 16},
        {"policy": "h2o", "budget_rows": 16},
        {"policy": "rkv", "budget_rows": 16, "window": 4, "buffer": 4},
        {"policy": "offload"},
    ],
    ids=lambda c: c["policy"],
)
def test_reported_bytes_equal_tensors_held(tiny2, cfg):
    model, tok = tiny2
    cache = build_policy(cfg, model.config)
    generate(
        model, tok, ["some prompt with a few words", "and another"], cache, DecodeSettings(30, progress=False)
    )
    held = cache.resident_bytes()
    assert held["device"] + held["host"] == gc_tensor_bytes(cache) > 0
    if cfg["policy"] == "offload":
        assert held["host"] > held["device"]


def test_sequence_bytes_are_exact_with_unit_pages(tiny2):
    model, tok = tiny2
    cfg = {"policy": "full", "page_size": 1}
    out = generate(model, tok, ["one two three"], cfg, DecodeSettings(12, progress=False, stop_token_ids=[]))
    s = out[0].stats
    rows = s.rows[:, 0, 0]  # every layer and head holds the same rows under full KV
    assert (s.kv_bytes == rows * kv_bytes_per_token(model.config, torch.float32)).all()
    assert s.kv_bytes[-1] == full_kv_bytes(model.config, int(rows[-1]))


def test_evicting_policy_reports_fewer_bytes_than_full(tiny2):
    model, tok = tiny2
    s = DecodeSettings(80, progress=False, stop_token_ids=[])
    full = generate(model, tok, ["a prompt"], {"policy": "full"}, s)[0].stats
    stream = generate(model, tok, ["a prompt"], {"policy": "streaming", "budget_rows": 16}, s)[0].stats
    assert (stream.rows[-1] == 16).all() and (full.rows[-1] > 80).all()
    assert stream.kv_bytes[-1] < full.kv_bytes[-1] / 3
    assert stream.device_bytes[-1] < full.device_bytes[-1] / 2


def test_eviction_shrinks_the_pools(tiny2):
    model, _ = tiny2
    cache = build_policy({"policy": "streaming", "budget_rows": 8, "page_size": 4}, model.config)
    ids = torch.randint(0, 4000, (1, 64))
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)
    store = cache.layers[0].store
    assert store.n_pages == cache.kv_heads * 2  # 8 rows in pages of 4 per head, nothing else held
    assert store.k.numel() == cache.kv_heads * 8 * cache.head_dim


def test_full_kv_bytes_refuses_unknown_dtypes_and_impossible_counts(tiny2):
    """An unknown dtype name was a bare KeyError ('fp16'); negative or fractional counts returned such byte counts."""
    config = tiny2[0].config
    assert full_kv_bytes(config, 0) == 0 and kv_bytes_per_token(config, "bfloat16") * 2 == kv_bytes_per_token(config)
    with pytest.raises(ValueError, match=r"dtype 'fp16': not a torch.dtype nor one of \['bfloat16', 'float16', 'float32'\]"):
        kv_bytes_per_token(config, "fp16")
    for bad in ({"tokens": -5}, {"tokens": 2.5}, {"tokens": 4, "batch": -1}):
        with pytest.raises(ValueError, match=r"full_kv_bytes: .* \(must be ints >= 0\)"):
            full_kv_bytes(config, **bad)
