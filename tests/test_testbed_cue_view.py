"""ZoomR's decoding-time view at the cue, as a training mask (issue 13: zoomr.testbed.cue_view)."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from zoomr.schemas.testbed import TestbedData
from zoomr.testbed import vocab as tt
from zoomr.testbed.cue_view import batch_cue_view, cue_view_mask
from zoomr.testbed.curriculum import collate, encode_problem
from zoomr.testbed.task import generate

DATA = TestbedData(trace_tokens=512, summaries=True, query_form="cue")


def _encoded(seed: int = 7):
    enc = tt.FastEncoder()
    p = generate(DATA, random.Random(seed))
    return p, enc, encode_problem(p, enc, window=64)


def test_cue_rows_see_the_prompt_and_the_window_only_not_the_far_definition_nor_its_summary():
    p, enc, (ids, _, _, meta) = _encoded()
    T, start, window = len(ids), meta["start"], 64
    mask = cue_view_mask(T, [start], [meta["cues"]], window)[0, 0]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    cue_rows = {r for c in meta["cues"] for r in (c.pos - 1, c.pos)}
    far = 0
    for cue, q in zip(meta["cues"], p.queries):
        assert [ids[cue.pos - 2], ids[cue.pos]] == [enc.ids[tt.QUERY], enc.ids[tt.QUERY_END]]  # "? k :"
        definition = start + q.fact.definition_pos
        for r in (cue.pos - 1, cue.pos):
            seen = set(mask[r].nonzero()[:, 0].tolist())
            assert seen == {j for j in range(r + 1) if j < start or j >= r - window}
            assert (definition in seen) == (definition >= r - window)
            a, b = meta["spans"][cue.target]
            assert (a in seen) == (a >= r - window)  # the target summary too: the pointer must come from the key
        far += cue.far
        assert mask[cue.pos + 1, definition]  # "=" reads the paragraph: the selection applies there
    assert far > 0  # the problem has far cues, so the mask hides something
    other = [r for r in range(T) if r not in cue_rows]
    assert torch.equal(mask[other], causal[other])


def test_a_window_over_the_whole_trace_is_the_causal_mask_and_the_model_reads_the_mask_as_given():
    _, enc, row = _encoded(3)
    batch = collate([row], enc.ids[tt.tokens.PAD], "trace", DATA.trace_tokens)
    T = batch.input_ids.shape[1]
    assert torch.equal(batch_cue_view(batch, T)[0, 0], torch.ones(T, T, dtype=torch.bool).tril())
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(enc.ids), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048)  # fmt: skip
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        plain = model(input_ids=batch.input_ids).logits
        wide = model(input_ids=batch.input_ids, attention_mask=batch_cue_view(batch, T)).logits
        narrow = model(input_ids=batch.input_ids, attention_mask=batch_cue_view(batch, 0)).logits
    assert torch.allclose(plain, wide, atol=1e-5)
    first = min(c.pos for c in batch.cues[0]) - 1  # rows before the first cue's key are untouched
    assert torch.allclose(plain[0, :first], narrow[0, :first], atol=1e-5)
    assert not torch.allclose(plain[0, first], narrow[0, first], atol=1e-3)


def test_batches_without_cues_use_the_plain_forward_and_bad_settings_are_refused():
    from train.testbed_pretrain import check_method
    from zoomr.schemas.testbed import TestbedTrainMethod

    enc = tt.FastEncoder()
    plain = collate([encode_problem(generate(TestbedData(trace_tokens=256), random.Random(0)), enc)], 0, "trace", 256)
    assert batch_cue_view(plain, 64) is None
    check_method(TestbedTrainMethod(cue_view_window=64), DATA)
    with pytest.raises(ValueError, match="cue_view_window"):
        check_method(TestbedTrainMethod(cue_view_window=64), TestbedData(summaries=False))
    with pytest.raises(ValueError, match="cue_view_window"):
        check_method(TestbedTrainMethod(cue_view_window=-1), DATA)
    with pytest.raises(ValueError, match="cue_view_previous_selection_from"):
        check_method(TestbedTrainMethod(cue_view_previous_selection_from=0), DATA)
    check_method(TestbedTrainMethod(summary_pointer_margin=3.0), DATA)
    with pytest.raises(ValueError, match="summary_pointer_margin"):
        check_method(TestbedTrainMethod(summary_pointer_margin=0.0), DATA)
    check_method(TestbedTrainMethod(key_spread_weight=10.0), DATA)
    with pytest.raises(ValueError, match="key_spread_weight"):
        check_method(TestbedTrainMethod(key_spread_weight=-1.0), DATA)
    check_method(TestbedTrainMethod(value_read_weight=1.0), DATA)
    with pytest.raises(ValueError, match="value_read_weight"):
        check_method(TestbedTrainMethod(value_read_weight=-1.0), DATA)
    with pytest.raises(ValueError, match="value_read_weight"):  # it needs a "=" row after each cue's ":"
        check_method(TestbedTrainMethod(value_read_weight=1.0), dataclasses.replace(DATA, query_form="inline"))
    with pytest.raises(ValueError, match="window"):
        cue_view_mask(4, [0], [[]], -1)


def test_paragraph_rows_hold_each_paragraphs_definitions_and_no_summary():
    from zoomr.testbed.cue_view import paragraph_rows

    p, enc, (ids, _, _, meta) = _encoded()
    regular = paragraph_rows(meta["start"], meta["spans"])
    assert len(regular) == len(meta["spans"])
    for fact in p.facts:
        lo, hi = regular[fact.paragraph - 1]
        assert lo <= meta["start"] + fact.definition_pos < hi
    for (_, hi), (a, _) in zip(regular, meta["spans"]):
        assert hi == a - 1  # up to the begin delimiter, which belongs to the summary
    # the policy's own segments (zoomr.segments): the same R_i, except that the policy's starts at the previous
    # paragraph break; the same S_i as previous_selection shows (delimiters included)
    from zoomr import tokens
    from zoomr.segments import segments_from_ids

    segs = segments_from_ids(ids, enc.ids[tokens.BEGIN_SUMMARY], enc.ids[tokens.END_SUMMARY], meta["start"])
    assert len(segs) == len(regular)
    for i, (seg, (lo, hi), (a, b)) in enumerate(zip(segs, regular, meta["spans"])):
        assert (seg.r_start + (i > 0), seg.r_end) == (lo, hi)
        assert (seg.s_start, seg.s_end) == (a - 1, b + 1)


def test_previous_selection_shows_the_zoomed_paragraphs_and_voted_summaries_of_the_selection_at_question_mark():
    from zoomr.summary_pointer import Cue, capture_qk, selection_hits
    from zoomr.testbed.cue_view import paragraph_rows, previous_selection

    _, enc, row = _encoded(5)
    batch = collate([row], enc.ids[tt.tokens.PAD], "trace", DATA.trace_tokens)
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=len(enc.ids), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048)  # fmt: skip
    model = LlamaForCausalLM(cfg).eval()
    spans, cues = batch.spans[0], batch.cues[0]
    with torch.no_grad(), capture_qk(model) as qk:
        model(input_ids=batch.input_ids)
        shown = previous_selection(qk, batch)
        picks = selection_hits(qk, spans, [Cue(c.pos - 2, c.target) for c in cues], 2, 2)
    regular = paragraph_rows(batch.starts[0], spans)
    assert len(shown[0]) == len(cues)
    for ranges, s in zip(shown[0], picks):
        assert ranges == [regular[i] for i in s.zoomed] + [(spans[i][0] - 1, spans[i][1] + 1) for i in s.summarized]
    mask = batch_cue_view(batch, 64, shown)[0, 0]
    for cue, ranges in zip(cues, shown[0]):
        for lo, hi in ranges:
            assert mask[cue.pos, lo:hi].all() and mask[cue.pos - 1, lo:hi].all()
    assert sum(len(r) for r in shown[0]) > 0  # a random model votes too: something is shown


def test_with_paragraph_topics_every_cue_row_after_question_mark_is_blind_to_the_paragraph():
    """``? t k :``: the topic row too is computed under the previous selection when decoding, so it sees only the
    prompt and the window in training; the selection at "?" is marked at the row before the topic."""
    data = dataclasses.replace(DATA, paragraph_topics=True)
    enc = tt.FastEncoder()
    p = generate(data, random.Random(7))
    ids, _, _, meta = encode_problem(p, enc, window=64)
    T, start, window = len(ids), meta["start"], 64
    mask = cue_view_mask(T, [start], [meta["cues"]], window)[0, 0]
    for cue in meta["cues"]:
        assert cue.start == cue.pos - 2 and ids[cue.start - 1] == enc.ids[tt.QUERY]
        for r in range(cue.start, cue.pos + 1):
            assert set(mask[r].nonzero()[:, 0].tolist()) == {j for j in range(r + 1) if j < start or j >= r - window}
        assert mask[cue.start - 1, : cue.start].all()  # "?" itself attends causally
    # the previous selection is the one made at "?", the row before the topic
    from zoomr.summary_pointer import Cue, capture_qk, selection_hits
    from zoomr.testbed.cue_view import paragraph_rows, previous_selection

    batch = collate([encode_problem(p, enc, window=64)], enc.ids[tt.tokens.PAD], "trace", data.trace_tokens)
    torch.manual_seed(2)
    cfg = LlamaConfig(vocab_size=len(enc.ids), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048)  # fmt: skip
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad(), capture_qk(model) as qk:
        model(input_ids=batch.input_ids)
        shown = previous_selection(qk, batch)
        at_question = selection_hits(qk, batch.spans[0], [Cue(c.pos - 3, c.target) for c in batch.cues[0]], 2, 2)
    spans, regular = batch.spans[0], paragraph_rows(batch.starts[0], batch.spans[0])
    assert shown[0] == [[regular[i] for i in s.zoomed] + [(spans[i][0] - 1, spans[i][1] + 1) for i in s.summarized]
                        for s in at_question]  # fmt: skip


def test_a_run_inside_its_warm_up_is_said(caplog):
    from train.testbed_pretrain import check_method
    from zoomr.schemas.testbed import TestbedTrainMethod

    with caplog.at_level("WARNING", logger="train.testbed_pretrain"):
        check_method(TestbedTrainMethod(max_steps=101, warmup_steps=100), DATA)
        assert not caplog.records
        check_method(TestbedTrainMethod(max_steps=100, warmup_steps=100), DATA)
    assert "warmup_steps=100 >= method.max_steps=100: the whole run is in the warm-up" in caplog.text
