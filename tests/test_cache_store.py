"""The KV store's hot path: views not copies, in-place compaction, exact release, both layouts equal a reference."""

from __future__ import annotations

import random

import pytest
import torch

from tests.conftest import tiny_spec
from zoomr.cache import PagedKV, build_policy
from zoomr.cache.streaming import sink_window_keep
from zoomr.models import load_model_and_tokenizer


def _store(B=2, H=2, p=4, attrs=("s",)) -> PagedKV:
    return PagedKV(batch=B, heads=H, head_dim=3, dtype=torch.float32, device="cpu", page_size=p, attrs=attrs)


def _append(store: PagedKV, ref, start: int, S: int = 1, valid: torch.Tensor | None = None) -> int:
    """Append S tokens with distinct key values (recorded in ``ref[b][h]`` as (key, order))."""
    B, H = store.batch, store.heads
    valid = torch.ones(B, S, dtype=torch.bool) if valid is None else valid
    keys = torch.zeros(B, H, S, 3)
    order = torch.zeros(B, S, dtype=torch.long)
    for b in range(B):
        for s in range(S):
            order[b, s] = start
            for h in range(H):
                start += 1
                keys[b, h, s] = start
                if valid[b, s]:
                    ref[b][h].append((float(start), int(order[b, s])))
    store.append(keys, -keys, order, order, valid)
    return start


def _check(store: PagedKV, ref) -> None:
    rows = store.rows()
    for b, per_head in enumerate(ref):
        for h, want in enumerate(per_head):
            n = int(store.n[b, h])
            assert n == len(want)
            assert rows.keys[b, h, :n, 0].tolist() == [k for k, _ in want]
            assert rows.values[b, h, :n, 0].tolist() == [-k for k, _ in want]
            assert rows.order[b, h, :n].tolist() == [o for _, o in want]
            assert (rows.pos[b, h, n:] == -1).all() and not rows.valid[b, h, n:].any()
    assert (store.n_min, store.n_max) == (int(store.n.min()), int(store.n.max()))
    assert store.bytes() == sum(t.numel() * t.element_size() for t in store.tensors())


def test_rows_are_views_of_the_buffers_and_lazy():
    """Issue 17: every step re-gathered every layer's rows (a copy) and built pos/order gathers nobody read."""
    store, ref = _store(), [[[], []], [[], []]]
    _append(store, ref, 0, S=5)
    rows = store.rows()
    assert rows.keys.untyped_storage().data_ptr() == store.k.untyped_storage().data_ptr()  # a view, no copy
    assert rows.values.untyped_storage().data_ptr() == store.v.untyped_storage().data_ptr()
    assert rows._pos is None and rows._order is None and rows._valid is None  # nothing built yet
    assert rows.all_valid  # known from the row counts, no reduction
    assert rows.order[0, 0].tolist() == [o for _, o in ref[0][0]] and rows._order is not None


def test_steady_state_eviction_reuses_the_buffers():
    """Issue 17: each eviction shrank the pools to exact size and the next append regrew them (two copies per
    step). A StreamingLLM-like steady state (append one row, evict one) must reallocate only in rare bursts."""
    store, ref = _store(B=1, H=2, p=4), [[[], []]]
    cnt = _append(store, ref, 0, S=40)
    cnt = _append(store, ref, cnt)  # first growth (geometric) happens here
    for per in ref[0]:
        del per[4]
    store.retain(torch.arange(41).expand(1, 2, 41) != 4)
    buffer = store.k.untyped_storage().data_ptr()
    for _ in range(60):
        cnt = _append(store, ref, cnt)
        keep = torch.ones(1, 2, 41, dtype=torch.bool)
        keep[:, :, 4] = False  # 4 sinks, then the oldest window row
        store.retain(keep)
        for per in ref[0]:
            del per[4]
        assert (
            store.k.untyped_storage().data_ptr() == buffer
        )  # compaction in place, front reclaimed in bursts
        _check(store, ref)
    assert int(store.n.max()) == 40 and store.k.numel() < 2 * 40 * 2 * 3


def test_retain_shrinks_when_most_of_the_buffer_is_free():
    store, ref = _store(B=1, H=2, p=4), [[[], []]]
    _append(store, ref, 0, S=64)
    store.retain(torch.arange(64).expand(1, 2, 64) >= 56)
    assert store.n_max == 8 and store.cap == 8  # exact size: evicted rows left memory
    assert store.k.numel() == 2 * 8 * 3


def test_uneven_heads_switch_to_pages_and_back():
    store, ref = _store(B=1, H=2, p=2), [[[], []]]
    cnt = _append(store, ref, 0, S=12)
    keep = torch.zeros(1, 2, 12, dtype=torch.bool)
    keep[0, 0, :10] = True
    keep[0, 1, [3]] = True
    store.retain(keep)
    ref[0][0], ref[0][1] = ref[0][0][:10], [ref[0][1][3]]
    assert not store.slab and store.n_pages == 5 + 1  # ragged: exact pages, no slab padding
    _check(store, ref)
    cnt = _append(store, ref, cnt, S=3)
    _check(store, ref)
    keep = torch.zeros(1, 2, 13, dtype=torch.bool)
    keep[0, 0, :4] = True
    keep[0, 1, :4] = True
    store.retain(keep)
    ref[0][0], ref[0][1] = ref[0][0][:4], ref[0][1][:4]
    assert store.slab  # even again: contiguous views
    _check(store, ref)


@pytest.mark.parametrize("seed", range(12))
def test_random_operations_match_a_reference(seed):
    """Appends (padded or not), evictions of every shape, spans, attribute updates and batch selection."""
    rng = random.Random(seed)
    B, H = rng.randint(1, 3), rng.randint(1, 3)
    store = _store(B=B, H=H, p=rng.choice([1, 3, 16]))
    ref = [[[] for _ in range(H)] for _ in range(B)]
    score = [[[] for _ in range(H)] for _ in range(B)]
    cnt = 0
    for _ in range(40):
        op = rng.random()
        if op < 0.5 or store.n_max == 0:
            S = rng.choice([1, 1, 2, 5])
            valid = torch.rand(B, S) < (1.0 if rng.random() < 0.6 else 0.6)
            cnt = _append(store, ref, cnt, S, valid)
            for b in range(B):
                for h in range(H):
                    score[b][h] += [0.0] * int(valid[b].sum())
        elif op < 0.65:
            delta = torch.randint(0, 3, (B, H, store.n_max)).float()
            store.add_to_attr("s", delta)
            for b in range(B):
                for h in range(H):
                    score[b][h] = [x + float(delta[b, h, j]) for j, x in enumerate(score[b][h])]
        elif op < 0.8:
            N = store.n_max
            keep = torch.rand(B, H, N) < rng.random()
            if rng.random() < 0.5:
                keep = torch.ones(B, H, N, dtype=torch.bool)
                keep[:, :, rng.randrange(N)] = False
            store.retain(keep)
            for b in range(B):
                for h in range(H):
                    ref[b][h] = [x for j, x in enumerate(ref[b][h]) if keep[b, h, j]]
                    score[b][h] = [x for j, x in enumerate(score[b][h]) if keep[b, h, j]]
        elif op < 0.92:
            lo = rng.randrange(store.n_max + 1)
            hi = rng.randint(lo, store.n_max)
            store.evict_span(lo, hi)
            for b in range(B):
                for h in range(H):
                    ref[b][h] = ref[b][h][:lo] + ref[b][h][hi:]
                    score[b][h] = score[b][h][:lo] + score[b][h][hi:]
        elif B > 1:
            idx = sorted(rng.sample(range(B), rng.randint(1, B)))
            store.select_batch(torch.tensor(idx))
            ref, score, B = [ref[i] for i in idx], [score[i] for i in idx], len(idx)
        _check(store, ref)
        got = store.attr("s")
        for b in range(B):
            for h in range(H):
                assert got[b, h, : len(score[b][h])].tolist() == score[b][h]


def test_streaming_span_path_equals_the_mask_path(cache_dir):
    """StreamingLLM's slice eviction (even rows) keeps exactly what its keep mask keeps."""
    model, _ = load_model_and_tokenizer(
        tiny_spec("qwen2", num_hidden_layers=2), cache_dir, attn_implementation="zoomr"
    )
    ids = torch.randint(0, 4000, (1, 50))
    fast = build_policy({"policy": "streaming", "budget_rows": 16, "n_sink": 4}, model.config)
    slow = build_policy({"policy": "streaming", "budget_rows": 16, "n_sink": 4}, model.config)

    def mask_path(layer):  # the generic path: a keep mask through retain
        if layer.store.n_max > 16:
            slow.evict(layer.idx, sink_window_keep(layer.store.n, layer.store.n_max, 4, 12))

    slow.after_attention = mask_path
    with torch.no_grad():
        a = [model(ids[:, :20], cache=fast, use_cache=True).logits]
        b = [model(ids[:, :20], cache=slow, use_cache=True).logits]
        for t in range(20, 50):
            pos = torch.tensor([[t]])
            a.append(model(ids[:, t : t + 1], cache=fast, use_cache=True, position_ids=pos).logits)
            b.append(model(ids[:, t : t + 1], cache=slow, use_cache=True, position_ids=pos).logits)
    assert torch.equal(torch.cat(a, 1), torch.cat(b, 1))
    for la, lb in zip(fast.layers, slow.layers):
        ra, rb = la.store.rows(), lb.store.rows()
        assert torch.equal(ra.keys, rb.keys) and torch.equal(ra.order, rb.order)
        assert ra.order[0, 0, :5].tolist() == [0, 1, 2, 3, 38]  # sinks + the most recent rows


@pytest.mark.parametrize("seed", range(6))
def test_drop_rows_equals_retain_of_the_same_rows(seed):
    """``drop_rows`` (one row per (b, h), H2O's steady step) keeps what ``retain`` keeps, attributes included,
    on even slabs (the sort-free slide) and on uneven or paged stores (the fallback)."""
    rng = random.Random(seed)
    B, H = rng.randint(1, 3), rng.randint(1, 3)
    fast, slow = _store(B=B, H=H, p=rng.choice([1, 4])), _store(B=B, H=H, p=rng.choice([1, 4]))
    ref = [[[] for _ in range(H)] for _ in range(B)]
    cnt = 0
    for step in range(12):
        valid = torch.ones(B, 3, dtype=torch.bool) if seed % 2 == 0 or step < 2 else torch.rand(B, 3) < 0.7
        before = cnt
        cnt = _append(fast, ref, before, 3, valid)
        _append(slow, [[[] for _ in range(H)] for _ in range(B)], before, 3, valid)
        delta = torch.rand(B, H, fast.n_max)
        fast.add_to_attr("s", delta)
        slow.add_to_attr("s", delta)
        if fast.n_min == 0:
            continue
        j = torch.stack([torch.randint(0, int(n), (1,)) for n in fast.n.flatten()]).view(B, H)
        fast.drop_rows(j)
        keep = torch.arange(slow.n_max) != j[:, :, None]
        slow.retain(keep & slow.rows().valid)
        for b in range(B):
            for h in range(H):
                del ref[b][h][int(j[b, h])]
        _check(fast, ref)
        assert torch.equal(fast.attr("s"), slow.attr("s"))
        held = fast.rows().valid
        assert torch.equal(fast.rows().keys[held], slow.rows().keys[held])


@pytest.mark.parametrize("seed", range(8))
def test_paged_tail_evictions_slide_in_place(seed):
    """KVzap's decode step on a ragged (paged) store: each step appends a row and drops, in some (b, h), the row
    ``window`` rows from the end. The rows slide in place (the pools are not reallocated at every eviction, as
    a rebuild would) and still equal a reference, attributes included; free pages stay under a quarter."""
    rng = random.Random(seed)
    B, H, window = rng.randint(1, 3), rng.randint(2, 3), rng.choice([3, 6])
    store = _store(B=B, H=H, p=rng.choice([1, 4]))
    ref = [[[] for _ in range(H)] for _ in range(B)]
    score = [[[] for _ in range(H)] for _ in range(B)]
    cnt = _append(store, ref, 0, S=40)
    keep = torch.arange(40).expand(B, H, 40) % (3 * torch.arange(H).view(1, H, 1) + 1) == 0  # head h: every (3h+1)-th
    store.retain(keep)
    for b in range(B):
        for h in range(H):
            ref[b][h] = [x for j, x in enumerate(ref[b][h]) if keep[b, h, j]]
            score[b][h] = [0.0] * len(ref[b][h])
    assert not store.slab
    kept_pools = 0
    for _ in range(60):
        valid = torch.rand(B, 1) < 0.9
        cnt = _append(store, ref, cnt, 1, valid)
        delta = torch.randint(0, 3, (B, H, store.n_max)).float()
        store.add_to_attr("s", delta)
        for b in range(B):
            for h in range(H):
                score[b][h] += [0.0] * int(valid[b, 0])
                score[b][h] = [x + float(delta[b, h, j]) for j, x in enumerate(score[b][h])]
        keep = store.rows().valid.clone()
        for b in range(B):
            for h in range(H):
                n = len(ref[b][h])
                if n > window and h and rng.random() < 0.7:  # head 0 keeps everything: the counts stay uneven
                    keep[b, h, n - 1 - window] = False
                    del ref[b][h][n - 1 - window], score[b][h][n - 1 - window]
        pools = store.k.data_ptr()
        store.retain(keep)
        kept_pools += store.k.data_ptr() == pools
        assert 4 * store.free.numel() <= store.n_pages
        _check(store, ref)
        got = store.attr("s")
        for b in range(B):
            for h in range(H):
                assert got[b, h, : len(score[b][h])].tolist() == score[b][h]
    assert not store.slab and kept_pools >= 40  # in place at most steps (a rebuild reallocates the pools)
