"""LightThinker: segmentation, the stream, the thought mask, and the serving policy (parity, freeing, batching)."""

from __future__ import annotations

import pytest
import torch

from zoomr import tokens
from zoomr.abridge.data import collate
from zoomr.abridge.forward import full_kv_response_ce
from zoomr.abridge.layout import IGNORE, PAD, PROMPT, RAW
from zoomr.cache import build_policy
from zoomr.cache.lightthinker import LightThinkerCache, LightThinkerMethod
from zoomr.engine import DecodeSettings, generate
from zoomr.lightthinker.layout import (
    CACHE,
    CONTINUE,
    ThoughtTokens,
    interleave,
    paper_cache_tokens,
    response_ids,
    save_config,
    segment_response,
)
from zoomr.lightthinker.mask import thought_masks, thought_response_ce
from zoomr.lightthinker.parity import parity_report, splitter_script

PROMPT_TEXT = "Every morning Aya goes for a walk"
TT = ThoughtTokens(splitter=90, cache=(91, 92, 93), cont=94)


@pytest.fixture(scope="module")
def model_tok(tiny_model_and_tokenizer):
    return tiny_model_and_tokenizer


# ---------------------------------------------------------------- segmentation and stream


def test_thoughts_are_the_paragraphs_inside_the_thought_tags():
    response = (
        f"{tokens.BEGIN_THOUGHT}\n\nFirst, add.\n\nThen multiply.\n\n\nCheck: 42.\n\n"
        f"{tokens.END_THOUGHT}\n\n{tokens.BEGIN_SOLUTION}The answer is 42.{tokens.END_SOLUTION}"
    )
    thoughts, tail = segment_response(response)
    assert "".join(thoughts) + tail == response
    assert thoughts == [
        f"{tokens.BEGIN_THOUGHT}\n\nFirst, add.\n\n",  # the opening tag joins the first thought
        "Then multiply.\n\n\n",
        "Check: 42.\n\n",  # the blank line before the closing tag joins the last one
    ]
    assert tail.startswith(tokens.END_THOUGHT)
    merged, _ = segment_response(response, min_chars=11)  # "Check: 42." joins the previous one
    assert len(merged) == 2 and "".join(merged) == "".join(thoughts)


def test_untagged_responses_are_cut_into_paragraphs_and_the_last_is_the_answer():
    response = "w1 k3 v4 \n\n w2 ? k3 v4 \n\n \\boxed{ ? k3 v4 }"
    thoughts, tail = segment_response(response)
    assert thoughts == ["w1 k3 v4 \n\n ", "w2 ? k3 v4 \n\n "] and tail == "\\boxed{ ? k3 v4 }"
    assert segment_response("one paragraph only") == ([], "one paragraph only")


def test_stream_inserts_cache_and_continue_after_each_splitter_but_the_last():
    response = [10, 11, TT.splitter, 12, TT.splitter, 13, 14, TT.splitter]
    s = interleave([1, 2], response, TT)
    assert s.input_ids == [1, 2, 10, 11, 90, 91, 92, 93, 94, 12, 90, 91, 92, 93, 94, 13, 14, 90]
    assert s.kind[:2] == [PROMPT, PROMPT] and s.kind[5:9] == [CACHE] * 3 + [CONTINUE]
    assert s.block == [-1, -1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2]
    assert s.position_ids == list(range(len(s)))
    labelled = [t for t in s.labels if t != IGNORE]
    assert labelled == response  # every written token (splitters included) is predicted exactly once
    assert s.labels[4] == IGNORE and s.labels[7] == IGNORE  # nothing predicts a cache / continue token
    assert s.labels[8] == 12  # <|continue|> predicts the next thought's first token


def test_response_ids_put_a_splitter_after_every_thought(model_tok):
    _, tok = model_tok
    tt = ThoughtTokens.from_tokenizer(tok, 9)
    ids = response_ids(["a b\n\n", "c\n\n"], "done", tok, tt.splitter)
    assert ids.count(tt.splitter) == 2 and ids[-1] != tt.splitter
    assert tok.decode(ids) == f"a b\n\n{tokens.SPLITTER}c\n\n{tokens.SPLITTER}done"
    with pytest.raises(ValueError, match="LightThinker tokens"):
        ThoughtTokens.from_tokenizer(tok, 12)  # the tokenizer carries 9 cache tokens
    assert paper_cache_tokens("qwen2") == 9 and paper_cache_tokens("llama") == 7
    with pytest.raises(ValueError, match="num_cache_tokens"):
        paper_cache_tokens("gpt2")


# ---------------------------------------------------------------- the mask


def _reference_visible(s, q: int) -> set[int]:
    """What serving holds when stream token q runs: simulate the cache, independently of the mask code."""
    resident: list[int] = []
    thought: list[int] = []
    for i in range(q + 1):
        kind = s.kind[i]
        if kind == CONTINUE:  # the thought (and its splitter) were freed after the cache tokens ran
            resident = [j for j in resident if j not in thought]
            thought = []
        resident.append(i)
        if kind == RAW:
            thought.append(i)
        if kind == PROMPT:
            thought = []
    return set(resident)


def _streams():
    return [
        interleave([1, 2, 3], [10, 11, 90, 12, 13, 14, 90, 15, 90, 16], TT),
        interleave([1, 2], [20, 90, 21], TT),
    ]


def test_dense_mask_matches_what_serving_holds_token_by_token():
    streams = _streams()
    batch = collate(streams, pad_id=0)
    masks = thought_masks(batch, num_layers=3, backend="dense")
    assert masks[0] is masks[2]  # the same mask at every layer
    length = batch["input_ids"].shape[1]
    for b, s in enumerate(streams):
        for q in range(length):
            row = masks[0][b, 0, q].nonzero()[:, 0].tolist()
            expected = {q} if q >= len(s) else _reference_visible(s, q)
            assert set(row) == expected, (b, q)
    assert (batch["kind"][1, len(streams[1]) :] == PAD).all()


@torch.no_grad()
@pytest.mark.parametrize("other", ["flex", "chunked"])
def test_flex_chunked_and_dense_backends_give_the_same_loss_on_cpu(model_tok, other):
    model, tok = model_tok
    tt = ThoughtTokens.from_tokenizer(tok, 4)
    ids = [(i * 37) % 3000 + 50 for i in range(40)]
    streams = [
        interleave([5, 6, 7], ids[:12] + [tt.splitter] + ids[12:30], tt),
        interleave([8, 9], ids[:9], tt),
    ]
    batch = collate(streams, pad_id=0)
    dense = torch.cat(thought_response_ce(model, batch, "dense"))
    got = torch.cat(thought_response_ce(model, batch, other))
    assert dense.numel() == 31 + 9
    assert (dense - got).abs().max() < 1e-4
    assert model.config._attn_implementation == "sdpa"  # restored after the masked forward
    no_thought = collate([streams[1]], pad_id=0)  # no splitter: the mask is plain causal
    plain = torch.cat(thought_response_ce(model, no_thought, "dense"))
    assert (plain - torch.cat(full_kv_response_ce(model, no_thought))).abs().max() < 1e-5


# ---------------------------------------------------------------- serving


def test_trainer_and_incremental_generator_agree(model_tok):
    """Parity: per-token CE of the masked forward vs the engine that deletes each thought's KV."""
    model, tok = model_tok
    prompt = tok(PROMPT_TEXT, add_special_tokens=False).input_ids
    script = splitter_script(tok, [9, 21, 34, 46], 60)
    r = parity_report(model, tok, prompt, 4, max_new_tokens=60, script=script)
    assert r["tokens"] == 60 and r["thoughts_freed"] == 4 and r["forced_tokens_run"] == 4 * 5
    assert r["max_abs_ce_diff"] < 4.5e-4, r  # fp32 tiny model: ~6e-7 measured
    assert r["wrong_over_parity"] >= 100, r  # thoughts never hidden: ~1e5x further off
    # negative control: the uncompressed history is a different function, and wherever it disagrees
    # with the masked forward the served model sides with the masked forward
    assert r["disagreeing_tokens"] > 0
    assert r["served_follows_compressing"] == r["disagreeing_tokens"], r


def test_thoughts_are_freed_physically(model_tok):
    model, tok = model_tok
    prompt = tok(PROMPT_TEXT, add_special_tokens=False).input_ids
    n = 3
    cache = LightThinkerCache(LightThinkerMethod(page_size=1), model.config, tok, num_cache_tokens=n)
    settings = DecodeSettings(max_new_tokens=40, stop_token_ids=[], progress=False)
    script = [splitter_script(tok, [7, 19], 40)]
    out = generate(model, tok, [prompt], cache, settings, script=script)[0]
    # prompt + 2 thoughts x (n cache + continue) + the open thought's 19 fed tokens (t = 20..38)
    expected = len(prompt) + 2 * (n + 1) + 19
    assert out.stats.rows[-1].tolist() == [[expected] * 2] * 4
    row_bytes = 2 * cache.kv_heads * cache.head_dim * 4  # K and V, fp32, page_size 1: exact
    assert [int(layer.store.seq_kv_bytes()[0]) for layer in cache.layers] == [expected * row_bytes] * 4
    # the rows held are exactly those the mask lets the last token (sampled, not fed yet) see
    tt = ThoughtTokens.from_tokenizer(tok, n)
    s = interleave(prompt, out.token_ids, tt)
    visible = set(thought_masks(collate([s], 0), 1, "dense")[0][0, 0, len(s) - 1].nonzero()[:, 0].tolist())
    held = cache.layers[0].store.rows().order[0, 0].tolist()
    assert set(held) == visible - {len(s) - 1}
    # step 8 feeds the splitter written at t = 7 with the cache tokens: thought 0 (t = 0..7) goes at once
    assert out.stats.rows[7].min() == len(prompt) + 7 and out.stats.rows[8].max() == len(prompt) + n + 1
    full = generate(model, tok, [prompt], {"policy": "full"}, settings, script=script)[0]
    assert full.stats.rows[-1].min() == len(prompt) + 39


def test_batched_generation_matches_one_by_one(model_tok):
    model, tok = model_tok
    prompts = [tok(p, add_special_tokens=False).input_ids for p in (PROMPT_TEXT, "Find the sum", "x y z w")]
    scripts = [splitter_script(tok, at, 30) for at in ([5, 17], [11], [3, 9, 20])]
    settings = DecodeSettings(max_new_tokens=30, stop_token_ids=[], progress=False)

    def run(ps, ss):
        cache = LightThinkerCache(LightThinkerMethod(), model.config, tok, num_cache_tokens=4)
        return generate(model, tok, ps, cache, settings, script=ss)

    together = run(prompts, scripts)
    for p, sc, out in zip(prompts, scripts, together):
        alone = run([p], [sc])[0]
        assert alone.token_ids == out.token_ids
        assert (alone.stats.rows[-1] == out.stats.rows[-1]).all()
    assert len({int(o.stats.rows[-1].max()) - len(p) for o, p in zip(together, prompts)}) > 1


def test_policy_builds_from_the_method_config_and_reads_checkpoints(model_tok, tmp_path):
    model, tok = model_tok
    with pytest.raises(FileNotFoundError, match="has no lightthinker.json.*method.allow_untrained=true"):
        build_policy({"name": "lightthinker"}, model.config, tok)  # an untrained model: refused
    untrained = {"name": "lightthinker", "allow_untrained": True}
    cache = build_policy(untrained, model.config, tok)
    assert isinstance(cache, LightThinkerCache) and cache.tt.n == 9  # the paper's n for qwen
    assert build_policy({**untrained, "num_cache_tokens": 5}, model.config, tok).tt.n == 5
    save_config(tmp_path, 6)
    config = model.config.__class__.from_dict(model.config.to_dict())
    config._name_or_path = str(tmp_path)
    assert build_policy({"name": "lightthinker"}, config, tok).tt.n == 6  # the checkpoint's n
    assert build_policy({"name": "lightthinker", "num_cache_tokens": 6}, config, tok).tt.n == 6
    # another n was served as the checkpoint's 6 while config.json said 5
    with pytest.raises(ValueError, match=r"num_cache_tokens=5, but .*lightthinker.json was trained with 6 cache"):
        build_policy({"name": "lightthinker", "num_cache_tokens": 5}, config, tok)
    assert build_policy({"name": "lightthinker", "num_cache_tokens": 5, "layout_from_checkpoint": False}, config,
                        tok).tt.n == 5  # fmt: skip
    (tmp_path / "lightthinker.json").write_text('{"num_cache_tokens": "6"}')  # was int("6"); a typo: a traceback
    with pytest.raises(ValueError, match="lightthinker.json: num_cache_tokens must be an integer >= 1, got '6'"):
        build_policy({"name": "lightthinker"}, config, tok)
    with pytest.raises(ValueError, match="tokenizer"):
        build_policy(untrained, model.config, None)


def test_without_hiding_the_thought_from_continue_parity_breaks(model_tok, monkeypatch):
    """The ``hidden_rows`` hook is what keeps ``<|continue|>`` (same forward as the cache tokens) off the
    thought: without it the served function is no longer the trained one."""
    model, tok = model_tok
    prompt = tok(PROMPT_TEXT, add_special_tokens=False).input_ids
    monkeypatch.setattr(LightThinkerCache, "hidden_rows", lambda self, layer: None)
    r = parity_report(model, tok, prompt, 4, max_new_tokens=30, script=splitter_script(tok, [9, 21], 30))
    assert r["thoughts_freed"] == 2 and r["max_abs_ce_diff"] > 1e-2, r


@torch.no_grad()
def test_splitter_accuracy_counts_the_data_splitters(model_tok):
    from zoomr.lightthinker.mask import splitter_accuracy

    model, tok = model_tok
    tt = ThoughtTokens.from_tokenizer(tok, 4)
    ids = [(i * 37) % 3000 + 50 for i in range(20)]
    streams = [interleave([5, 6], ids[:6] + [tt.splitter] + ids[6:12] + [tt.splitter] + ids[12:], tt)]
    r = splitter_accuracy(model, streams, 0, tt.splitter, "dense")
    assert r["splitters"] == 2 and 0.0 <= r["recall"] <= 1.0 and 0.0 <= r["precision"] <= 1.0
    # a model whose output layer always says <|splitter|> finds every splitter, with precision 2 / 22
    bias = torch.zeros(model.config.vocab_size)
    bias[tt.splitter] = 1e4
    handle = model.lm_head.register_forward_hook(lambda mod, inp, out: out + bias)
    try:
        r = splitter_accuracy(model, streams, 0, tt.splitter, "dense")
    finally:
        handle.remove()
    assert r["recall"] == 1.0 and r["precision"] == pytest.approx(2 / 22)
