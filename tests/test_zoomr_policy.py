"""ZoomR decoding policy: voting by hand, full-KV equivalence, exact I_f composition, resident rows, offload."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_spec
from zoomr import tokens
from zoomr.cache import build_policy
from zoomr.cache.zoomr import consensus, head_votes
from zoomr.engine import DecodeSettings, generate
from zoomr.models import load_model_and_tokenizer

# --------------------------------------------------------------------------------------------- voting by hand


def one_hot_query(picks: list[int], reverse: bool, d: int = 4) -> torch.Tensor:
    """A query whose scores against one-hot mean keys rank ``picks`` first (reversed keys: index d-1-i)."""
    q = torch.zeros(d)
    for rank, i in enumerate(picks):
        q[d - 1 - i if reverse else i] = 10.0 - rank
    return q


def test_hand_built_votes_consensus_and_agreeability():
    # 2 layers x 4 query heads, 2 KV heads (GQA group 2); KV head 0's mean keys are e_i, KV head 1's e_{3-i}
    kbar = torch.stack([torch.eye(4), torch.eye(4).flip(0)])[None]  # [B=1, Hkv=2, M=4, d=4]
    picks = {
        0: [[0, 1], [1, 3], [1, 0], [2, 3]],  # layer 0, query heads 0..3 -> their top-2
        1: [[1, 3], [0, 1], [3, 1], [1, 2]],
    }
    votes = torch.zeros(1, 4, dtype=torch.long)
    for layer in (0, 1):
        q = torch.stack([one_hot_query(p, reverse=h >= 2) for h, p in enumerate(picks[layer])])[None]
        votes += head_votes(q, kbar, torch.tensor([4]), top_k=2)
    assert votes.tolist() == [[3, 7, 2, 4]]  # counted by hand from the table above
    result = consensus(votes[0], c=2)
    assert result.zoomed == [1, 3] and result.summarized == [0, 2]
    assert result.votes == {0: 3, 1: 7, 2: 2, 3: 4}
    assert result.agreeability == pytest.approx(11 / 16)


def test_votes_respect_each_sequences_summary_count_and_k():
    kbar = torch.eye(4)[None, None].expand(2, 1, 4, 4)
    q = torch.tensor([[0.0, 1, 2, 3], [0.0, 1, 2, 3]])[:, None, :].expand(2, 2, 4)  # two heads, same query
    v = head_votes(q, kbar, torch.tensor([4, 2]), top_k=3)
    assert v.tolist() == [[0, 2, 2, 2], [2, 2, 0, 0]]  # sequence 1 has only summaries 0, 1
    assert head_votes(q, kbar, torch.tensor([0, 0]), top_k=2).sum() == 0


def test_consensus_ties_and_empty():
    assert consensus(torch.tensor([2, 2, 1]), c=1).zoomed == [1]  # tie -> the later segment
    empty = consensus(torch.tensor([0, 0]), c=2)
    assert empty.zoomed == [] and empty.agreeability is None
    sumr = consensus(torch.tensor([1, 3, 0, 2]), c=0)
    assert sumr.zoomed == [] and sumr.summarized == [0, 1, 3] and sumr.agreeability == 0.0


# --------------------------------------------------------------------------------------------- on a model


@pytest.fixture(scope="module")
def tiny2(cache_dir):
    return load_model_and_tokenizer(
        tiny_spec("qwen2", num_hidden_layers=2), cache_dir, attn_implementation="zoomr"
    )


def trace_ids(
    tokenizer, n_prompt=20, n_para=6, para_len=12, summ_len=3, tail=10, seed=0
) -> tuple[torch.Tensor, int]:
    """A token stream shaped like a ZoomR generation: prompt, then paragraphs each ending with '.', followed
    by ``<|begin_of_summary|> … <|end_of_summary|>``. Filler tokens are never boundaries or delimiters."""
    from zoomr.segments import boundary_table

    g = torch.Generator().manual_seed(seed)
    table = boundary_table(tokenizer)
    plain = torch.tensor([i for i in range(200, 4000) if not table[i]])
    fill = lambda n: plain[torch.randint(len(plain), (n,), generator=g)].tolist()  # noqa: E731
    dot = tokenizer.convert_tokens_to_ids(".")
    b, e = (tokenizer.convert_tokens_to_ids(t) for t in tokens.SUMMARY_TAGS)
    ids = fill(n_prompt)
    for _ in range(n_para):
        ids += fill(para_len - 1) + [dot] + [b] + fill(summ_len) + [e]
    ids += fill(tail)
    return torch.tensor([ids]), n_prompt


def forced_logits(model, cache, ids: torch.Tensor, n_prefill: int, views: list | None = None) -> torch.Tensor:
    """Teacher-forced decoding through the step protocol; optionally record the positions layer 0 read."""
    if views is not None:
        original = cache.after_attention

        def record(layer):
            if layer.idx == 0:
                views.append(set(layer.view.pos[0, 0][layer.view.valid[0, 0]].tolist()))
            original(layer)

        cache.after_attention = record
    step = cache.begin_step(torch.ones(1, n_prefill, dtype=torch.bool), input_ids=ids[:, :n_prefill])
    out = [model(ids[:, :n_prefill], cache=cache, use_cache=True, position_ids=step.positions).logits[:, -1:]]
    cache.end_step()
    rows = []
    for t in range(n_prefill, ids.shape[1] - 1):
        step = cache.begin_step(torch.ones(1, 1, dtype=torch.bool), input_ids=ids[:, t : t + 1])
        out.append(model(ids[:, t : t + 1], cache=cache, use_cache=True, position_ids=step.positions).logits)
        cache.end_step()
        rows.append(cache.resident_rows())
    cache.rows_after_step = rows
    return torch.cat(out, 1)


def zoomr(tokenizer, model, **kw):
    cfg = {"policy": "zoomr", "top_k": 2, "consensus": 2, "window": 16, **kw}
    return build_policy(cfg, model.config, tokenizer)


@torch.no_grad()
def test_zooming_everything_equals_full_kv(tiny2):
    model, tok = tiny2
    ids, n_p = trace_ids(tok)
    ref = model(ids[:, :-1]).logits[:, n_p - 1 :]
    cache = zoomr(tok, model, top_k=100, consensus=100, window=16, zoom_keeps_summary=True)
    got = forced_logits(model, cache, ids, n_p)
    assert (got - ref).abs().max() <= 1e-5
    assert len(cache.recompute_log[0]) == 6  # one recompute per '.' (the only boundary token fed)
    # the paper's I_f (zoomed segments without their summaries) is a real restriction: logits differ
    paper = forced_logits(model, zoomr(tok, model, top_k=100, consensus=100, window=16), ids, n_p)
    assert (paper - ref).abs().max() > 1e-3


@torch.no_grad()
def test_selected_context_is_exactly_prompt_window_zoomed_and_voted(tiny2):
    model, tok = tiny2
    ids, n_p = trace_ids(tok, n_para=8)
    views: list[set[int]] = []
    cache = zoomr(tok, model, top_k=2, consensus=1, window=8)
    forced_logits(model, cache, ids, n_p, views=views)
    decode_views = views[1:]  # views[0] is the prefill
    tracker = cache.trackers[0]
    log = cache.recompute_log[0]
    assert len(log) == 8
    for rec in log[1:]:  # from the second recompute on, there are summaries to vote for
        assert rec["n_summaries"] >= 1 and rec["agreeability"] is not None
        # every (layer, query head) casts min(k, summaries) votes
        assert len(rec["zoomed"]) == 1 and sum(rec["votes"].values()) == 2 * 4 * min(2, rec["n_summaries"])
        n = rec["position"] + 1
        expected = set(range(n_p)) | set(range(n - 8, n))
        for i in rec["zoomed"]:
            expected |= set(tracker.segments[i].regular)
        for i in rec["summaries_kept"]:
            expected |= set(tracker.segments[i].summary)
        assert set(rec["votes"]) == set(rec["zoomed"]) | set(rec["summaries_kept"])
        assert rec["rows"] == len(expected)
        # the next step (position n) reads exactly I_f plus itself
        assert decode_views[n - n_p] == expected | {n}
    # reported resident rows = |I_f| (+ the rows appended since the recompute), for every layer and head
    for t, rows in enumerate(cache.rows_after_step[:-1]):
        assert rows.shape == (2, 1, 2)
        assert (rows == len(decode_views[t + 1]) - 1).all()


@torch.no_grad()
def test_vote_layers_variant_counts_only_the_listed_layers(tiny2):
    """The paper: every (layer, head) votes; ``vote_layers=[1]`` (a variant) halves the votes of this 2-layer model."""
    model, tok = tiny2
    ids, n_p = trace_ids(tok, n_para=8)
    votes = {}
    for name, layers in (("paper", None), ("layer1", [1])):
        cache = zoomr(tok, model, top_k=2, consensus=1, window=8, vote_layers=layers)
        forced_logits(model, cache, ids, n_p)
        votes[name] = [sum(r["votes"].values()) for r in cache.recompute_log[0][1:]]
    assert votes["paper"] == [2 * 4 * min(2, m) for m in range(1, 8)]
    assert votes["layer1"] == [v // 2 for v in votes["paper"]]
    with pytest.raises(ValueError, match="vote_layers"):
        zoomr(tok, model, vote_layers=[2])  # the model has layers 0..1
    with pytest.raises(ValueError, match="vote_layers"):
        zoomr(tok, model, vote_layers=[])


@pytest.mark.parametrize("layers", [[1.5], ["1"], [True], [1, 1], 1])
def test_vote_layers_that_name_no_layer_exactly_are_refused(layers):
    """method_config("zoomr", vote_layers=[1.5]) was accepted and no layer ever voted (1.5 is no layer index: ZoomR
    kept only the prompt and the window, without a word); ["1"] was a TypeError traceback, [True] layer 1."""
    from zoomr.configs import method_config
    from zoomr.schemas.checks import SettingsError

    with pytest.raises(SettingsError, match=r"vote_layers must be null or a non-empty list of distinct layer indices"):
        method_config("zoomr", vote_layers=layers)
    assert method_config("zoomr", vote_layers=[2, 1]).vote_layers == [2, 1]


def test_policy_configs_built_in_code_check_their_types():
    """A config dataclass built directly (not through method_config) took offload="false" as True and
    decoding="no" as pruning during decoding; budget_rows=16.5 kept 8.0 recent rows."""
    from zoomr.cache.h2o import H2OConfig
    from zoomr.cache.kvzap import KVzapMethod
    from zoomr.cache.zoomr import ZoomRConfig

    with pytest.raises(ValueError, match=r"method.offload='false' \(must be a bool\)"):
        ZoomRConfig(offload="false")
    with pytest.raises(ValueError, match=r"method.decoding='no' \(must be a bool\)"):
        KVzapMethod(decoding="no")
    with pytest.raises(ValueError, match=r"method.budget_rows=16.5 \(must be an int\)"):
        H2OConfig(budget_rows=16.5)
    assert ZoomRConfig(offload=False, window=8).window == 8 and KVzapMethod(threshold=-4).threshold == -4


@torch.no_grad()
def test_sumr_keeps_every_summary_and_no_regular_segment(tiny2):
    model, tok = tiny2
    ids, n_p = trace_ids(tok, n_para=5)
    views: list[set[int]] = []
    cache = build_policy(
        {"policy": "zoomr", "consensus": 0, "summaries": "all", "window": 4}, model.config, tok
    )
    forced_logits(model, cache, ids, n_p, views=views)
    rec = cache.recompute_log[0][-1]
    segs = cache.trackers[0].segments[: rec["n_summaries"]]
    n = rec["position"] + 1
    expected = set(range(n_p)) | set(range(n - 4, n)) | {p for s in segs for p in s.summary}
    assert rec["zoomed"] == [] and rec["summaries_kept"] == list(range(len(segs)))
    assert views[1:][n - n_p] == expected | {n}


@torch.no_grad()
def test_offload_gives_identical_logits(tiny2):
    model, tok = tiny2
    ids, n_p = trace_ids(tok)
    on = zoomr(tok, model, offload=True)  # host stores, next layer's rows prefetched (plain copies on CPU)
    off = zoomr(tok, model, offload=False)
    unfetched = zoomr(tok, model, offload=True, prefetch=False)
    a, b = forced_logits(model, on, ids, n_p), forced_logits(model, off, ids, n_p)
    assert torch.equal(a, b) and torch.equal(a, forced_logits(model, unfetched, ids, n_p))
    assert on.layers[0].store.role == "host" and off.layers[0].store.role == "device"
    held_on, held_off = on.resident_bytes(), off.resident_bytes()
    assert held_on["host"] > 0 and held_off["host"] == 0
    assert held_on["device"] < held_off["device"] / 5  # only the mean summary keys stay on the device


@torch.no_grad()
def test_engine_batch_equals_single_runs_and_reports_rows(tiny2):
    model, tok = tiny2
    prompts = [
        "So we have x = 3. Then y: 4! Why? Because.\n\nNext",
        "Short prompt.",
    ]
    cfg = {"policy": "zoomr", "window": 6, "recompute": "every"}
    s = DecodeSettings(max_new_tokens=24, progress=False)
    batch = generate(model, tok, prompts, build_policy(cfg, model.config, tok), s)
    for i, p in enumerate(prompts):
        single = generate(model, tok, [p], build_policy(cfg, model.config, tok), s)[0]
        assert single.token_ids == batch[i].token_ids
    out = batch[0]
    rows = out.stats.rows[1:]  # decode steps
    # no summaries: after each recompute I_f = prompt + window, so rows stay at prompt + 6
    assert (rows[-1] == out.prompt_tokens + 6).all()


def test_needs_tokenizer_and_token_ids(tiny2):
    model, _ = tiny2
    cache = build_policy({"policy": "zoomr"}, model.config)
    cache.begin_step(torch.ones(1, 3, dtype=torch.bool), input_ids=torch.tensor([[1, 2, 3]]))
    cache.end_step()
    with pytest.raises(RuntimeError, match="reads the generated tokens"):
        cache.begin_step(torch.ones(1, 1, dtype=torch.bool))
    cache = build_policy({"policy": "zoomr"}, model.config)
    cache.begin_step(torch.ones(1, 3, dtype=torch.bool), input_ids=torch.tensor([[1, 2, 3]]))
    cache.end_step()
    with pytest.raises(ValueError, match="needs the tokenizer"):
        cache.begin_step(torch.ones(1, 1, dtype=torch.bool), input_ids=torch.tensor([[4]]))


def test_tokenizer_without_delimiters_is_refused_when_the_policy_is_built(tiny2):
    """A tokenizer lacking the summary delimiters (a checkpoint never fine-tuned with +method=zoomr_sft) was refused
    only at the first decode step, after python -m eval had written its run state; now when the policy is built."""
    from eval.__main__ import check_policy
    from zoomr.configs import method_config

    model, tok = tiny2
    vocab = {t: i for t, i in tok.get_vocab().items() if t != tokens.END_SUMMARY}
    bare = type("BareTokenizer", (), {"get_vocab": lambda self: vocab})()
    with pytest.raises(ValueError, match=r"lacks the summary delimiters \['<\|end_of_summary\|>'\]"):
        build_policy({"policy": "zoomr"}, model.config, bare)
    with pytest.raises(SystemExit, match=r"(?s)nothing was written.*lacks the summary delimiters"):
        check_policy(method_config("sumr"), model, bare)
    assert check_policy(method_config("zoomr"), model, tok) is not None


@torch.no_grad()
def test_token_ids_past_the_tokenizer_are_no_boundary(tiny2):
    """A model whose embedding has more rows than its tokenizer has tokens (Qwen's padded vocabularies) can emit or be
    scripted an id past the boundary table: that was an IndexError mid-decode; such an id decodes to nothing, so it is
    no semantic boundary (no recompute there)."""
    import copy

    model, tok = tiny2
    padded = copy.deepcopy(model)
    padded.resize_token_embeddings(len(tok) + 8, mean_resizing=False)
    ids, n_p = trace_ids(tok)
    ids[0, n_p + 3] = len(tok) + 5
    cache = zoomr(tok, padded)
    forced_logits(padded, cache, ids, n_p)
    assert len(cache.recompute_log[0]) == 6  # the '.' of each paragraph, as without the extra id


@torch.no_grad()
def test_malformed_delimiters_follow_the_trackers_rule_and_are_logged_once(tiny2, caplog):
    """A nested <|begin_of_summary|> or a lone <|end_of_summary|> was handled by the tracker's rule without a word
    (its count was read by nothing); the first in each sequence is now logged with the rule applied."""
    model, tok = tiny2
    ids, n_p = trace_ids(tok, n_para=3)
    b, e = (tok.convert_tokens_to_ids(t) for t in tokens.SUMMARY_TAGS)
    ids = ids[0].tolist()
    ids[n_p + 2], ids[n_p + 30] = e, b  # a lone end in paragraph 0, a second begin inside summary 1 (29..33)
    cache = zoomr(tok, model)
    with caplog.at_level("WARNING", logger="zoomr.cache.zoomr"):
        forced_logits(model, cache, torch.tensor([ids]), n_p)
    warned = [r.getMessage() for r in caplog.records if r.name == "zoomr.cache.zoomr"]
    assert len(warned) == 1 and f"sequence 0 has {tokens.END_SUMMARY} at position {n_p + 2} with no summary open" in warned[0]
    assert cache.trackers[0].anomalies == 2  # the nested begin restarts summary 1: it holds rows from n_p + 30 on
    assert [s.s_start - n_p for s in cache.trackers[0].segments] == [12, 30, 46]
