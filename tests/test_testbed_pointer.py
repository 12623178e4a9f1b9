"""The summary pointer (issue 13): ZoomR's score over a teacher-forced pass, its loss and the hit rate of the paper's rule."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from zoomr.cache.zoomr import consensus, head_votes
from zoomr.schemas.testbed import TestbedData
from zoomr.summary_pointer import (
    Cue,
    capture_qk,
    key_spread_penalty,
    mean_summary_keys,
    pointer_loss,
    pointer_scores,
    selection_hits,
    target_ranks,
    value_read_loss,
)
from zoomr.testbed import vocab as tt
from zoomr.testbed.curriculum import encode_problem
from zoomr.testbed.task import generate

SPANS = [(2, 5), (8, 10), (13, 16), (19, 21)]  # summary content rows; the end delimiter sits at row `end`


def _qk(target_for_cue: dict[int, int], T: int = 30, Hq: int = 4, Hkv: int = 2, d: int = 64, seed: int = 0):
    """Random keys; the query at each cue position is the mean key of its chosen summary (strong pointer)."""
    g = torch.Generator().manual_seed(seed)
    key = torch.randn(1, Hkv, T, d, generator=g)
    query = 0.01 * torch.randn(1, Hq, T, d, generator=g)
    kbar = mean_summary_keys(key[0], SPANS)
    for pos, m in target_for_cue.items():
        query[0, :, pos] = 10 * kbar[torch.arange(Hq) // (Hq // Hkv), m]
    return {0: (query, key)}


def test_mean_summary_keys_average_the_content_rows():
    key = torch.arange(2 * 12 * 3, dtype=torch.float).reshape(2, 12, 3)
    kbar = mean_summary_keys(key, [(1, 4), (6, 7)])
    assert kbar.shape == (2, 2, 3)
    assert torch.equal(kbar[:, 0], key[:, 1:4].mean(1)) and torch.equal(kbar[:, 1], key[:, 6])


def test_an_empty_summary_averages_its_delimiters_as_the_policy_does_and_bad_spans_are_refused():
    """An empty summary (span (a, a): the delimiters at a-1 and a) had a NaN k̄: it took every head's top-k slot and
    voted for nothing (no hit, no AG) and made the pointer loss NaN; now it averages its delimiters, as ZoomRCache."""
    key = torch.randn(2, 12, 4, generator=torch.Generator().manual_seed(0))
    kbar = mean_summary_keys(key, [(1, 3), (6, 6)])
    assert torch.allclose(kbar[:, 1], key[:, 5:7].mean(1)) and torch.isfinite(kbar).all()
    qk = {0: (key[None].repeat_interleave(2, 1), key[None])}  # 4 query heads on 2 KV heads
    sel = selection_hits(qk, [(1, 3), (6, 6)], [Cue(10, 0), Cue(10, 1)], top_k=1, c=1)
    assert sel[0].agreeability is not None and sum(s.hit for s in sel) == 1  # one summary zoomed, one of the two targets
    assert torch.isfinite(pointer_loss(qk, [[(1, 3), (6, 6)]], [[Cue(10, 0)]], [0]))
    for bad in [(0, 0), (5, 3), (11, 14)]:
        with pytest.raises(ValueError, match=rf"summary span 1 = \({bad[0]}, {bad[1]}\)"):
            mean_summary_keys(key, [(1, 3), bad])


def test_cues_whose_summary_is_missing_or_not_yet_complete_are_refused():
    """A cue whose target summary ends after it made the pointer loss inf (then NaN weights, without a word); a target
    past the summaries was an IndexError from cross_entropy / the vote table. Both are refused naming the cue."""
    qk = _qk({})
    with pytest.raises(ValueError, match=r"sequence 0: the cue at row 9 targets summary 1, which ends at row 10"):
        pointer_loss(qk, [SPANS], [[Cue(25, 0), Cue(9, 1)]], [0])
    for run in (lambda: pointer_loss(qk, [SPANS], [[Cue(25, 4)]], [0]),
                lambda: selection_hits(qk, SPANS, [Cue(25, 4)], top_k=2, c=1)):  # fmt: skip
        with pytest.raises(ValueError, match=r"the cue at row 25 targets summary 4, but there are 4 summaries \(0..3\)"):
            run()
    assert not selection_hits(qk, SPANS, [Cue(9, 1)], top_k=2, c=1)[0].hit  # not complete yet: a miss, as decoding


def test_a_query_pointing_at_its_summary_is_a_hit_and_pointing_elsewhere_is_a_miss():
    cues = [Cue(25, 1, far=True), Cue(26, 3), Cue(27, 0)]
    qk = _qk({25: 1, 26: 3, 27: 2})  # the third cue points at summary 2, its fact is in summary 0
    sel = selection_hits(qk, SPANS, cues, top_k=1, c=1)
    assert [s.hit for s in sel] == [True, True, False]
    assert sel[0].far and not sel[1].far and sel[2].zoomed == [2] and sel[1].zoomed == [3]
    assert sel[0].target_votes == 4 and sel[0].agreeability == 1.0  # every head votes for it


def test_target_ranks_count_the_completed_summaries_that_outscore_the_target_per_head():
    cues = [Cue(25, 1), Cue(27, 0), Cue(15, 0)]
    qk = _qk({25: 1, 27: 2, 15: 1})  # cue 1 points at summary 2 (its fact is in 0); at row 15 only 0 and 1 are complete
    ranks = target_ranks(qk, SPANS, cues, layers=[0])
    assert ranks.shape == (3, 4)
    assert (ranks[0] == 0).all() and (ranks[1] >= 1).all() and (ranks[2] == 1).all()
    # the rank is the count of live summaries scoring above the target, as the scores themselves say
    q, k = qk[0]
    kbar = mean_summary_keys(k[0], SPANS)
    alpha = torch.einsum("hd,hmd->hm", q[0, :, 27], kbar.repeat_interleave(2, 0))
    assert torch.equal(ranks[1], (alpha > alpha[:, :1]).sum(1))
    assert torch.equal(target_ranks({0: qk[0], 1: qk[0]}, SPANS, cues, layers=[0, 1]), torch.cat([ranks, ranks], 1))


def test_only_completed_summaries_can_be_selected():
    # at row 15 summary 2 (end delimiter at row 16) is still open: a query pointing at it cannot select it
    qk = _qk({15: 2})
    (s,) = selection_hits(qk, SPANS, [Cue(15, 1)], top_k=1, c=1)
    assert s.n_summaries == 2 and 2 not in s.zoomed


def test_hit_rate_matches_the_policy_functions_and_is_at_chance_for_random_queries():
    """Random queries: the hit rate is c / (summaries); the votes are exactly head_votes + consensus of the policy."""
    hits, n = 0, 0
    for seed in range(60):
        qk = _qk({}, seed=seed)
        cues = [Cue(p, random.Random(seed * 100 + p).randrange(4)) for p in range(22, 30)]
        sel = selection_hits(qk, SPANS, cues, top_k=2, c=2)
        hits += sum(s.hit for s in sel)
        n += len(sel)
        query, key = qk[0]
        q = query[0][:, 22]  # [Hq, d]
        votes = head_votes(q[None], mean_summary_keys(key[0], SPANS)[None], torch.tensor([4]), 2)[0]
        assert sel[0].zoomed == consensus(votes, 2).zoomed
    assert abs(hits / n - 0.5) < 0.1  # c / M = 2 / 4


def test_pointer_loss_is_low_when_pointing_and_trains_the_queries():
    cues = [[Cue(25, 1), Cue(26, 3)]]
    good = pointer_loss(_qk({25: 1, 26: 3}), [SPANS], cues, layers=[0])
    bad = pointer_loss(_qk({25: 0, 26: 0}), [SPANS], cues, layers=[0])
    assert good < 0.5 < bad
    assert pointer_loss(_qk({}), [SPANS], [[]], layers=[0]) is None
    qk = _qk({})
    q = qk[0][0].requires_grad_(True)
    loss = pointer_loss({0: (q, qk[0][1])}, [SPANS], cues, layers=[0])
    loss.backward()
    assert q.grad[0, :, 25].abs().sum() > 0 and q.grad[0, :, 24].abs().sum() == 0  # only the cue rows


def test_margin_pointer_loss_is_the_hinge_on_the_strongest_competitor():
    """The margin variant: max(0, m − (α_target − max other α)) per head on q · k̄ / sqrt(d), averaged over cues."""
    cues = [[Cue(25, 1), Cue(26, 3)]]
    qk = _qk({25: 1, 26: 3})
    query, key = qk[0]
    d = query.shape[-1]
    alpha = pointer_scores(query[0][:, [25, 26]], mean_summary_keys(key[0], SPANS)) * d**-0.5  # [Hq, 2, M]
    live = torch.tensor([[end < c.pos for _, end in SPANS] for c in cues[0]])
    expect = []
    for n, c in enumerate(cues[0]):
        for h in range(alpha.shape[0]):
            rivals = [float(alpha[h, n, m]) for m in range(len(SPANS)) if m != c.target and live[n, m]]
            expect.append(max(0.0, 50.0 - (float(alpha[h, n, c.target]) - max(rivals))))
    got = pointer_loss(qk, [SPANS], cues, layers=[0], margin=50.0)
    assert sum(expect) > 0 and abs(float(got) - sum(expect) / alpha.shape[0] / 2) < 1e-4
    assert float(pointer_loss(qk, [SPANS], cues, layers=[0], margin=1e-3)) == 0  # met by every head: no gradient
    assert float(pointer_loss(_qk({25: 0, 26: 0}), [SPANS], cues, layers=[0], margin=1e-3)) > 0  # pointing elsewhere


def test_key_spread_penalty_is_the_mean_squared_cosine_of_distinct_centred_keys():
    """Centred before the cosine (n one-hot keys: cosine −1/(n−1)); 1 for keys on a line through their mean; equal
    to a pair loop; its gradient lowers it."""
    assert float(key_spread_penalty(torch.eye(6), [0, 1, 2, 3])) == pytest.approx(1 / 9, abs=1e-6)
    antipodes = torch.cat([torch.eye(3), -torch.eye(3)])  # mean 0: each key orthogonal to all but its antipode
    assert float(key_spread_penalty(antipodes, range(6))) == pytest.approx(6 / 30, abs=1e-6)
    assert float(key_spread_penalty(torch.eye(3) * 5 + 1, [0, 1, 2])) == pytest.approx(0.25, abs=1e-6)
    line = torch.tensor([[1.0, 2.0], [3.0, 6.0], [-2.0, -4.0]])
    assert float(key_spread_penalty(line, [0, 1, 2])) == pytest.approx(1.0, abs=1e-6)
    emb = torch.randn(20, 8, generator=torch.Generator().manual_seed(0), requires_grad=True)
    ids = [2, 5, 7, 11, 13]
    x = torch.nn.functional.normalize(emb[ids] - emb[ids].mean(0), dim=-1).detach()
    pairs = [float(x[i] @ x[j]) ** 2 for i in range(5) for j in range(5) if i != j]
    got = key_spread_penalty(emb, ids)
    before = got.item()
    assert before == pytest.approx(sum(pairs) / len(pairs), abs=1e-6)
    got.backward()
    with torch.no_grad():
        assert key_spread_penalty(emb - 0.1 * emb.grad, ids).item() < before


def test_capture_records_post_rope_queries_and_keys_of_a_real_llama():
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")  # fmt: skip
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (1, 12))
    cache = DynamicCache(config=cfg)
    with torch.no_grad():
        ref = model(input_ids=ids, cache=cache).logits
        with capture_qk(model) as qk:
            out = model(input_ids=ids).logits
    assert model.config._attn_implementation == "sdpa"  # restored
    assert torch.allclose(out, ref, atol=1e-6)  # capturing changes nothing
    assert sorted(qk) == [0, 1] and qk[0][0].shape == (1, 4, 12, 8) and qk[0][1].shape == (1, 2, 12, 8)
    for layer in (0, 1):  # the keys are those a cache stores: after RoPE
        assert torch.allclose(qk[layer][1], cache.layers[layer].keys, atol=1e-6)
    with torch.no_grad(), capture_qk(model) as outer:  # nested (an evaluation inside a training loop's capture)
        model(input_ids=ids[:, :5])
        with capture_qk(model) as inner:
            model(input_ids=ids)
        assert inner[0][1].shape[2] == 12 and outer[0][1].shape[2] == 5  # the inner capture took the inner forward
    assert model.config._attn_implementation == "sdpa"


def test_value_read_loss_is_the_attention_a_real_llama_pays_the_defining_value_at_equals():
    """exp(−loss) per cue = the eager attention (``output_attentions``) of the ``=`` row on the row after the key's
    first response occurrence, averaged over the layers' query heads; its gradient raises that attention."""
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, attn_implementation="eager")  # fmt: skip
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    # prompt 0-2 (holds key 7 too: not a definition), "7 40" at 4-5, "9 41" at 6-7, filler, "? 7 : = 40" at 10-14
    ids = torch.tensor([[1, 7, 2, 3, 7, 40, 9, 41, 5, 6, 60, 7, 61, 62, 40, 60, 9, 61, 62, 41]])
    cues = [[Cue(12, 0), Cue(17, 0)]]  # ":" rows; the "=" rows 13 and 18 must read rows 5 and 7
    with capture_qk(model) as qk:
        model(input_ids=ids)
        loss = value_read_loss(qk, ids, [3], cues, [0, 1])
    with torch.no_grad():
        att = model(input_ids=ids, output_attentions=True).attentions  # per layer [1, Hq, T, T]
    want = torch.stack([torch.cat([a[0, :, 13, 5], a[0, :, 18, 7]]) for a in att]).view(2, 2, 4).mean(dim=(0, 2))
    assert torch.allclose(loss, -torch.log(want + 1e-9).mean(), atol=1e-5)
    assert value_read_loss(qk, ids, [3], [[]], [0, 1]) is None
    before = loss.item()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for _ in range(20):
        with capture_qk(model) as qk:
            model(input_ids=ids)
            loss = value_read_loss(qk, ids, [3], cues, [0, 1])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < before - 0.5


def test_encoded_cues_point_at_the_defining_summary():
    enc = tt.FastEncoder()
    p = generate(TestbedData(trace_tokens=512, summaries=True, query_form="cue"), random.Random(7))
    ids, _, _, meta = encode_problem(p, enc, window=64)
    vocab = enc.ids
    assert len(meta["spans"]) == p.n_paragraphs and len(meta["cues"]) == len(p.queries)
    for cue, q in zip(meta["cues"], p.queries):
        assert ids[cue.pos] == vocab[":"] and ids[cue.pos - 1] == vocab[tt.key(q.fact.key)]
        a, b = meta["spans"][cue.target]
        assert vocab[tt.key(q.fact.key)] in ids[a:b]  # the target summary names the queried key
        assert b < cue.pos  # and is complete before the cue
    assert any(c.far for c in meta["cues"]) and not all(c.far for c in meta["cues"])
    assert encode_problem(generate(TestbedData(trace_tokens=256), random.Random(0)), enc)[3]["cues"] == []


def test_key_cues_sit_on_the_key_before_each_boundary_and_bad_settings_are_refused(tmp_path):
    from train.testbed_pretrain import check_method
    from zoomr.schemas.testbed import TestbedTrainMethod
    from zoomr.summary_pointer import with_key_cues

    enc = tt.FastEncoder()
    data = TestbedData(summaries=True, trace_tokens=512)
    ids, _, _, meta = encode_problem(generate(data, random.Random(3)), enc)
    cues = with_key_cues([meta["cues"]])[0]
    n = len(meta["cues"])
    assert len(cues) == 2 * n and cues[:n] == meta["cues"]
    inv = {v: k for k, v in enc.ids.items()}
    for boundary, key in zip(cues[:n], cues[n:]):
        assert inv[ids[boundary.pos]] == ":" and inv[ids[key.pos]].startswith("k") and key.target == boundary.target
        span = meta["spans"][key.target]
        assert ids[key.pos] in ids[span[0] : span[1]]  # the key is in the summary it points at
    check_method(TestbedTrainMethod(summary_pointer_at_key=True), data)
    with pytest.raises(ValueError, match="summary_pointer_at_key"):
        check_method(TestbedTrainMethod(summary_pointer_at_key=True), TestbedData(summaries=False))
    with pytest.raises(ValueError, match="summary_pointer_at_key"):
        check_method(TestbedTrainMethod(summary_pointer_at_key=True), TestbedData(summaries=True, query_form="inline"))
    with pytest.raises(FileNotFoundError, match="not a checkpoint directory"):  # printed alone (ModelPathError)
        check_method(TestbedTrainMethod(init_from=str(tmp_path)), data)


@pytest.mark.parametrize("layers", [[1], None])
def test_trainer_pointer_layers(layers):
    from train.testbed_pretrain import pointer_layers
    from zoomr.schemas.testbed import TestbedTrainMethod

    model = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                                         num_attention_heads=2, num_key_value_heads=1))  # fmt: skip
    n = model.config.num_hidden_layers
    got = pointer_layers(n, TestbedTrainMethod(summary_pointer_layers=layers))
    assert got == ([1] if layers else [1, 2])
    with pytest.raises(ValueError, match="summary_pointer_layers"):
        pointer_layers(n, TestbedTrainMethod(summary_pointer_layers=[3]))


def test_online_hit_rate_reads_the_recompute_at_each_cue():
    """The evaluator's hit rate: the recompute logged at prompt + cue_pos, hit iff I_c holds segment defined_in - 1."""
    from analysis.zoomr_testbed import cue_selections, hit_rates

    record = {"queries": [
        {"cue_pos": 50, "answer_pos": 52, "distance": 20, "defined_in": 2, "final": False},  # defined at 32: near
        {"cue_pos": 90, "answer_pos": 92, "distance": 80, "defined_in": 1, "final": True},  # defined at 12: far
        {"cue_pos": 95, "answer_pos": 97, "distance": 80, "defined_in": 3, "final": True},
    ]}  # fmt: skip
    log = [
        {"position": 10 + 50, "zoomed": [1, 2], "n_summaries": 3, "votes": {"1": 9, "2": 7}},
        {"position": 10 + 90, "zoomed": [2, 3], "n_summaries": 4, "votes": {"0": 3, "2": 8, "3": 6}},  # the miss
        {"position": 10 + 95, "zoomed": [2, 3], "n_summaries": 4},  # no votes logged: counted as 0
        {"position": 10 + 51, "zoomed": [0], "n_summaries": 3},  # another recompute: not a cue
    ]
    sel = cue_selections(record, log, prompt_len=10, window=64)
    assert [s["hit"] for s in sel] == [True, False, True] and [s["far"] for s in sel] == [False, True, True]
    rates = hit_rates([sel], consensus=2)
    assert rates["hit_rate"] == 2 / 3 and rates["hit_rate_far"] == 0.5 and rates["hit_rate_final"] == 0.5
    assert rates["chance"] == (2 / 3 + 0.5 + 0.5) / 3 and rates["cues_far"] == 2
    assert rates["hit_rate_by_distance"] == {"<128": 2 / 3, "128-512": pytest.approx(float("nan"), nan_ok=True),
                                             ">=512": pytest.approx(float("nan"), nan_ok=True)}  # fmt: skip
    # the miss (target 0): 3 votes for it, 8 for the most-voted wrong summary
    assert rates["miss_votes"] == {"target_votes": 3.0, "top_wrong_votes": 8.0}
    assert [s["target_votes"] for s in sel] == [9, 3, 0]


def test_miss_tally_buckets_misses_by_summaries_back_and_counts_unanimous_ones():
    from analysis.testbed_pointer import MissTally

    cues = [Cue(25, 3), Cue(26, 0), Cue(27, 1)]  # 4 summaries complete: 0, 3 and 2 summaries back
    right, wrong = _qk({25: 3, 26: 2, 27: 1}), _qk({25: 3, 26: 2, 27: 2})
    tally = MissTally(top_k=1, content_layers=[1])
    tally.add({0: right[0], 1: wrong[0]}, [SPANS], [cues], c=1)  # cue 27: layer 0 right, layer 1 wrong: a tie
    out = tally.summary()
    assert out["cues_by_summaries_back"] == {"0": 1, "1-3": 2, "4-9": 0, "10+": 0}
    misses = [s.hit for s in selection_hits({0: right[0], 1: wrong[0]}, SPANS, cues, top_k=1, c=1)].count(False)
    assert out["misses"] == misses >= 1
    assert out["unanimous_misses"] == misses  # every miss here has every head of layer 1 voting for summary 2
    assert out["miss_rate_by_summaries_back"]["0"] == 0.0 and out["miss_rate_by_summaries_back"]["4-9"] is None


def test_miss_tally_scores_the_named_word_against_the_winning_summary_at_each_miss():
    """``at_misses``: the target summary's word that the cue names scores high while its other words score low,
    and a wrong summary whose words all score moderately wins the mean: the tally reports exactly those dots."""
    from analysis.testbed_pointer import MissTally

    T, d = 30, 4
    ids = torch.arange(100, 100 + T)
    ids[23] = ids[3]  # the cue's key (row pos - 1 = 23) is the word at row 3 of summary 0 (rows 2-4)
    cue = Cue(24, 0)
    key = torch.zeros(1, 1, T, d)
    key[0, 0, 3] = torch.tensor([6.0, 0, 0, 0])  # the named word: q · k = 6
    key[0, 0, 2] = key[0, 0, 4] = torch.tensor([-3.0, 0, 0, 0])  # its other words: -3 each (mean 0)
    key[0, 0, 8:10] = torch.tensor([1.0, 0, 0, 0])  # summary 1: every word 1 (mean 1 > 0): it wins
    query = torch.zeros(1, 1, T, d)
    query[0, 0, 24] = torch.tensor([1.0, 0, 0, 0])
    qk = {1: (query, key)}
    tally = MissTally(top_k=1, content_layers=[1])
    tally.add(qk, [SPANS[:2]], [[cue]], c=1, input_ids=ids[None])
    out = tally.summary()
    assert out["misses"] == 1
    assert out["at_misses"] == {"heads": 1, "named_word": 6.0, "target_other_words": -3.0, "winner_best_word": 1.0,
                                "winner_mean": 1.0, "named_word_beats_every_winner_word": 1.0}  # fmt: skip
