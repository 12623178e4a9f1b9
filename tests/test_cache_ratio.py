"""SnapKV and StreamingLLM at a compression ratio (``compression_ratio``, kvpress's definition): each prompt keeps
``int(n * (1 - ratio))`` rows, so these baselines run at the compression KVzap or the KVzip+ oracle achieved."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import tiny_spec
from zoomr.cache import build_policy
from zoomr.cache.ratio import kept_at_ratio
from zoomr.cache.snapkv import SnapKVConfig, top_plus_window
from zoomr.cache.streaming import StreamingConfig
from zoomr.engine import DecodeSettings, generate
from zoomr.models import load_model_and_tokenizer


@pytest.fixture(scope="module")
def tiny2(cache_dir):
    return load_model_and_tokenizer(
        tiny_spec("qwen2", num_hidden_layers=2), cache_dir, attn_implementation="zoomr"
    )


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, 4000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def kept_positions(cache, layer: int, b: int = 0) -> list[list[int]]:
    rows = cache.layers[layer].store.rows()
    return [sorted(rows.pos[b, h][rows.valid[b, h]].tolist()) for h in range(rows.pos.shape[1])]


def test_kept_at_ratio_and_per_head_budgets_by_hand():
    assert kept_at_ratio(torch.tensor([48, 30, 7]), 0.5).tolist() == [24, 15, 3]
    assert kept_at_ratio(torch.tensor([48, 30, 7]), 0.5, minimum=8).tolist() == [24, 15, 7]
    scores = torch.tensor([[[0.1, 0.9, 0.3, 0.8, 0.2, -float("inf"), -float("inf")]]]).repeat(2, 1, 1)
    keep = top_plus_window(scores, torch.tensor([[7], [7]]), torch.tensor([[4], [3]]), window=2)
    assert keep[0, 0].nonzero().flatten().tolist() == [1, 3, 5, 6]  # top 2 + window
    assert keep[1, 0].nonzero().flatten().tolist() == [1, 5, 6]  # top 1 + window


def test_ratio_configs_are_validated():
    with pytest.raises(ValueError, match="budget_rows=null"):
        SnapKVConfig(compression_ratio=0.5)  # budget_rows defaults to 1024
    with pytest.raises(ValueError, match=r"in \[0, 1\)"):
        StreamingConfig(budget_rows=None, compression_ratio=1.0)
    assert SnapKVConfig(budget_rows=None, compression_ratio=0.5).compression_ratio == 0.5


def test_snapkv_ratio_keeps_each_prompts_share_and_the_fixed_budget_rows(tiny2):
    model, tok = tiny2
    a, b = _prompt(48, 1), _prompt(30, 2)
    cfg = {"policy": "snapkv", "budget_rows": None, "compression_ratio": 0.5, "window": 8}
    outs = generate(model, tok, [a, b], cfg, DecodeSettings(max_new_tokens=3, temperature=0))
    assert np.unique(outs[0].stats.rows[0]).tolist() == [24] and np.unique(
        outs[1].stats.rows[0]
    ).tolist() == [15]
    assert np.unique(outs[0].stats.rows[-1]).tolist() == [24 + 2]  # decoding appends, never evicts
    # the rows kept for a prompt at ratio 0.5 are those of a fixed budget of int(48 * 0.5) rows
    ratio_cache = build_policy(cfg, model.config)
    fixed_cache = build_policy({"policy": "snapkv", "budget_rows": 24, "window": 8}, model.config)
    for cache in (ratio_cache, fixed_cache):
        with torch.no_grad():
            model(torch.tensor([a]), cache=cache, use_cache=True)
    for layer in range(2):
        assert kept_positions(ratio_cache, layer) == kept_positions(fixed_cache, layer)


def test_streaming_ratio_prunes_the_prompt_once_to_sinks_and_recent_rows(tiny2):
    model, tok = tiny2
    cfg = {"policy": "streaming", "budget_rows": None, "compression_ratio": 0.5, "n_sink": 4}
    cache = build_policy(cfg, model.config)
    with torch.no_grad():
        model(torch.tensor([_prompt(48, 3)]), cache=cache, use_cache=True)
    expect = [*range(4), *range(48 - 20, 48)]  # int(48 * 0.5) = 24 rows: 4 sinks + the last 20
    assert all(h == expect for layer in range(2) for h in kept_positions(cache, layer))
    outs = generate(
        model, tok, [_prompt(48, 3), _prompt(30, 4)], cfg, DecodeSettings(max_new_tokens=4, temperature=0)
    )
    assert [np.unique(o.stats.rows[0]).tolist() for o in outs] == [[24], [15]]
    assert np.unique(outs[0].stats.rows[-1]).tolist() == [24 + 3]  # no eviction while decoding
