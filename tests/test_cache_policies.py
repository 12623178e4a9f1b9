"""Each policy keeps exactly the rows its spec says (hand-checkable inputs and independent recomputations)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import tiny_spec
from zoomr.cache import PagedKV, build_policy
from zoomr.cache.evict_block import block_keep
from zoomr.cache.h2o import heavy_recent_keep
from zoomr.cache.queries import push_queries
from zoomr.cache.rkv import redundancy, rkv_scores
from zoomr.cache.snapkv import top_plus_window
from zoomr.engine import DecodeSettings, generate
from zoomr.models import load_model_and_tokenizer


@pytest.fixture(scope="module")
def tiny2(cache_dir):
    return load_model_and_tokenizer(
        tiny_spec("qwen2", num_hidden_layers=2), cache_dir, attn_implementation="zoomr"
    )


def kept_positions(cache, layer: int, b: int = 0) -> list[list[int]]:
    rows = cache.layers[layer].store.rows()
    return [sorted(rows.pos[b, h][rows.valid[b, h]].tolist()) for h in range(rows.pos.shape[1])]


def eager_attentions(model, ids):
    """Independent attention maps of a no-cache forward (eager implementation)."""
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            return model(ids, output_attentions=True).attentions  # per layer [B, H_q, S, S]
    finally:
        model.set_attn_implementation("zoomr")


# --------------------------------------------------------------------------------------------- pure rules


def test_heavy_recent_keep_by_hand():
    scores = torch.tensor([[[5.0, 1, 4, 0, 3, 9, 2, 7], [0, 0, 0, 0, 0, 0, 0, 0]]])
    n = torch.tensor([[8, 4]])
    keep = heavy_recent_keep(scores, n, heavy=2, recent=3)
    assert keep[0, 0].nonzero().flatten().tolist() == [0, 2, 5, 6, 7]  # top-2 older (5, 4) + last 3
    assert keep[0, 1].nonzero().flatten().tolist() == [0, 1, 2, 3]  # 4 rows <= budget 5: all kept


def test_top_plus_window_by_hand():
    scores = torch.tensor([[[0.1, 0.9, 0.3, 0.8, 0.2, -float("inf"), -float("inf")]]])
    keep = top_plus_window(scores, torch.tensor([[7]]), budget=4, window=2)
    assert keep[0, 0].nonzero().flatten().tolist() == [1, 3, 5, 6]


def test_rkv_redundancy_by_hand():
    keys = torch.tensor([[[[1.0, 0], [1, 0], [1, 0], [0, 1]]]])
    red = redundancy(keys, torch.tensor([[4]]), threshold=0.5)
    # rows 0,1,2 are duplicates; each row exempts its most recent duplicate (0->2, 1->2, 2->1):
    # remaining pairs (0,1), (1,0), (2,0) -> column means [2, 1, 0, 0] / 4, then softmax
    assert torch.allclose(red[0, 0], torch.softmax(torch.tensor([0.5, 0.25, 0.0, 0.0]), -1))


def test_rkv_importance_uses_group_max_and_older_rows():
    # 1 KV head, 2 query heads; window 1 query; 3 older rows + 1 window row (n = 4)
    keys = torch.tensor([[[[1.0, 0], [0, 1], [-1, 0], [0, -1]]]])
    q = torch.tensor([[[[4.0, 0]], [[0, 4.0]]]])  # head 0 likes row 0, head 1 likes row 1
    s = rkv_scores(keys, torch.tensor([[4]]), q, window=1, kernel=1, lam=1.0, threshold=2.0)
    logits = torch.tensor([[4.0, 0, -4], [0, 4.0, 0]]).amax(0) / 2**0.5  # max over the group: [4, 4, 0]/sqrt2
    assert torch.allclose(s[0, 0, :3], torch.softmax(logits, -1)) and s[0, 0, 3] == -float("inf")


def test_block_keep_by_hand():
    order = torch.arange(12)[None, None].repeat(1, 2, 1)
    valid = order < 11
    scores = torch.tensor([[9.0] * 12, [float(i % 3) for i in range(12)]])[None]
    keep = block_keep(order, valid, torch.tensor([3]), block_size=4, quota=2, scores=scores)
    # rows 3..6 are the completed block; head 0 ties (first two), head 1 scores [0, 1, 2, 0] -> rows 4, 5
    assert keep[0, 1].nonzero().flatten().tolist() == [0, 1, 2, 4, 5, 7, 8, 9, 10]
    assert int(keep[0, 0, 3:7].sum()) == 2 and keep[0, 0, 7:11].all() and not keep[0, 0, 11]


def test_push_queries_keeps_last_valid_per_sequence():
    q = torch.arange(2 * 1 * 4, dtype=torch.float32).view(2, 1, 4, 1)
    valid = torch.tensor([[False, True, True, True], [True, True, False, False]])
    ring, rv = push_queries(None, None, q, valid, window=2)
    assert ring[0, 0, :, 0].tolist() == [2.0, 3.0] and rv[0].all()
    assert ring[1, 0, :, 0].tolist() == [4.0, 5.0] and rv[1].all()
    ring, rv = push_queries(ring, rv, q[:, :, :1] + 100, torch.tensor([[True], [False]]), window=2)
    assert ring[0, 0, :, 0].tolist() == [3.0, 100.0] and ring[1, 0, :, 0].tolist() == [4.0, 5.0]


# --------------------------------------------------------------------------------------------- end to end


def test_h2o_prefill_keeps_top_accumulated_attention(tiny2):
    """After prefill, H2O's kept rows per layer/head = top by column sums of the eager attention (GQA sum)."""
    model, _ = tiny2
    S, budget, recent = 40, 16, 6
    ids = torch.randint(0, 4000, (1, S), generator=torch.Generator().manual_seed(4))
    attns = eager_attentions(model, ids)
    cache = build_policy({"policy": "h2o", "budget_rows": budget, "recent_rows": recent}, model.config)
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)
    for layer, a in enumerate(attns):
        received = a[0].sum(1).view(cache.kv_heads, cache.group, S).sum(1)  # [H_kv, S]
        for h in range(cache.kv_heads):
            older = received[h, : S - recent]
            heavy = sorted(torch.argsort(older, descending=True)[: budget - recent].tolist())
            assert kept_positions(cache, layer)[h] == heavy + list(range(S - recent, S)), (layer, h)


def test_h2o_decode_evicts_one_row_per_step(tiny2):
    model, tok = tiny2
    out = generate(
        model, tok, ["a b c d e f"], {"policy": "h2o", "budget_rows": 10}, DecodeSettings(20, progress=False)
    )
    rows = out[0].stats.rows
    assert rows.max() == 10 and (rows[-1] == 10).all()


def test_h2o_steady_step_equals_the_general_rule(tiny2, monkeypatch):
    """The one-row-over-budget fast path (argmin + ``drop_rows``) keeps exactly what ``heavy_recent_keep`` keeps:
    the same logits and the same rows at every decode step, batch of two."""
    model, _ = tiny2
    cfg = {"policy": "h2o", "budget_rows": 12, "recent_rows": 4}
    fast, slow = build_policy(cfg, model.config), build_policy(cfg, model.config)

    def general(layer):  # the mask path for every step
        store = layer.store
        if store.n_max > 12:
            slow.evict(layer.idx, heavy_recent_keep(store.attr("score"), store.n, 8, 4))

    slow.after_attention = general
    dropped = []
    drop_rows = PagedKV.drop_rows
    monkeypatch.setattr(PagedKV, "drop_rows", lambda store, j: (dropped.append(1), drop_rows(store, j)))
    ids = torch.randint(0, 4000, (2, 40), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        a = [model(ids[:, :16], cache=fast, use_cache=True).logits]
        b = [model(ids[:, :16], cache=slow, use_cache=True).logits]
        for t in range(16, 40):
            pos = torch.full((2, 1), t)
            a.append(model(ids[:, t : t + 1], cache=fast, use_cache=True, position_ids=pos).logits)
            b.append(model(ids[:, t : t + 1], cache=slow, use_cache=True, position_ids=pos).logits)
            for layer in range(2):
                assert kept_positions(fast, layer, 1) == kept_positions(slow, layer, 1), (t, layer)
    assert torch.equal(torch.cat(a, 1), torch.cat(b, 1))
    assert fast.layers[0].store.n_max == 12
    assert len(dropped) == 24 * 2  # every decode step of every layer took the fast path


def test_snapkv_prefill_keeps_window_vote(tiny2):
    """SnapKV's kept rows = top of the pooled window attention (independent eager recomputation) + window."""
    model, _ = tiny2
    S, budget, w, k = 48, 20, 8, 5
    ids = torch.randint(0, 4000, (1, S), generator=torch.Generator().manual_seed(5))
    attns = eager_attentions(model, ids)
    cfg = {"policy": "snapkv", "budget_rows": budget, "window": w, "kernel": k}
    cache = build_policy(cfg, model.config)
    with torch.no_grad():
        model(ids, cache=cache, use_cache=True)
    for layer, a in enumerate(attns):
        vote = a[0, :, -w:, : S - w].mean(1)  # [H_q, S - w]
        pooled = F.avg_pool1d(vote[:, None], k, stride=1, padding=k // 2)[:, 0]
        per_kv = pooled.view(cache.kv_heads, cache.group, -1).mean(1)
        for h in range(cache.kv_heads):
            top = sorted(torch.topk(per_kv[h], budget - w).indices.tolist())
            assert kept_positions(cache, layer)[h] == top + list(range(S - w, S)), (layer, h)
    # decoding then appends without evicting
    with torch.no_grad():
        model(ids[:, :1], cache=cache, use_cache=True, position_ids=torch.tensor([[S]]))
    assert cache.resident_rows().unique().tolist() == [budget + 1]


def test_rkv_compacts_to_budget_keeping_the_window(tiny2):
    model, tok = tiny2
    cfg = {"policy": "rkv", "budget_rows": 12, "window": 4, "buffer": 6, "kernel": 3}
    cache = build_policy(cfg, model.config)
    out = generate(
        model, tok, ["one two three four five"], cache, DecodeSettings(40, progress=False, stop_token_ids=[])
    )
    rows = out[0].stats.rows[:, 0, 0]
    assert rows.max() == 17 and rows.min() >= 5  # grows to budget + buffer - 1, compacts when it reaches 18
    n_fed = int(cache.fed[0])
    for layer in range(cache.num_layers):
        for pos in kept_positions(cache, layer):
            assert pos[-4:] == list(range(n_fed - 4, n_fed)) or len(pos) < 12  # the window is always kept


def test_rkv_serving_shares_one_set_across_heads_and_layers(tiny2):
    model, tok = tiny2
    cfg = {"policy": "rkv_serving", "budget_rows": 10, "window": 4, "compact_every": 8}
    cache = build_policy(cfg, model.config)
    generate(
        model,
        tok,
        ["alpha beta gamma delta epsilon zeta eta"],
        cache,
        DecodeSettings(24, progress=False, stop_token_ids=[]),
    )
    sets = [p for layer in range(cache.num_layers) for p in kept_positions(cache, layer)]
    assert all(s == sets[0] for s in sets)
    assert len(sets[0]) == 10 + (23 % 8)  # compacted at decode step 16, then 7 more rows appended


@pytest.mark.parametrize("rule", ["recency", "random", "attention"])
def test_block_eviction_keeps_quota_of_each_completed_block(tiny2, rule):
    model, tok = tiny2
    prompt = tok("p q r", add_special_tokens=False).input_ids
    P, C, K = len(prompt), 6, 2
    cfg = {"policy": "evict_block", "rule": rule, "block_size": C, "quota": K}
    cache = build_policy(cfg, model.config)
    generate(model, tok, [prompt], cache, DecodeSettings(20, progress=False, stop_token_ids=[]))
    fed = int(
        cache.fed[0]
    )  # P + 19 generated rows: blocks [P, P+6), [P+6, P+12), [P+12, P+18); open block of 1
    for layer in range(cache.num_layers):
        for pos in kept_positions(cache, layer):
            assert pos[:P] == list(range(P))
            for blk in range(3):
                inside = [p for p in pos if P + blk * C <= p < P + (blk + 1) * C]
                assert len(inside) == K
                if rule == "recency":
                    assert inside == [P + (blk + 1) * C - 2, P + (blk + 1) * C - 1]
            assert pos[-1] == fed - 1 and len(pos) == P + 3 * K + 1


def test_offload_holds_rows_on_host(tiny2):
    model, tok = tiny2
    out = generate(model, tok, ["hello world"], {"policy": "offload"}, DecodeSettings(10, progress=False))
    full = generate(model, tok, ["hello world"], {"policy": "full"}, DecodeSettings(10, progress=False))
    assert out[0].token_ids == full[0].token_ids
    s = out[0].stats
    assert (s.kv_bytes == 0).all() and (s.kv_bytes_host == full[0].stats.kv_bytes).all()
    assert (s.host_bytes > 0).all() and (s.device_bytes < 1024).all()  # only step counters stay on the device
