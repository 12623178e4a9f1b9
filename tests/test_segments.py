"""Thought/paragraph splitting on real traces, summary insertion, token-level segment tracking, boundaries."""

from __future__ import annotations

import pytest

from data_prep.traces import load_trace_rows
from tests.conftest import tiny_spec
from zoomr import tokens
from zoomr.segments import (
    SegmentTracker,
    boundary_table,
    insert_summaries,
    is_semantic_boundary,
    segments_from_ids,
    split_paragraphs,
    split_thought,
    token_pieces,
)

TRACES = "data_prep/data/traces/sky-t1-math-correct-5k-32b-ckpt140_aime24.jsonl"


@pytest.fixture(scope="module")
def trace_rows():
    rows, _ = load_trace_rows(source="local", path=TRACES, format="skythought_eval")
    return rows


def test_split_thought_reconstructs_every_real_trace(trace_rows):
    closed = 0
    for row in trace_rows:
        split = split_thought(row.response)
        assert split is not None
        assert split.prefix + split.thought + split.suffix == row.response
        assert split.prefix.rstrip().endswith(tokens.BEGIN_THOUGHT)
        assert split.thought == split.thought.strip()
        closed += split.closed
        if split.closed:
            assert split.suffix.lstrip().startswith(tokens.END_THOUGHT)
    # the vendored sample mixes complete and truncated generations
    assert 0 < closed < len(trace_rows)


@pytest.mark.parametrize("min_chars", [0, 300, 2000])
def test_paragraphs_reconstruct_exactly(trace_rows, min_chars):
    for row in trace_rows:
        thought = split_thought(row.response).thought
        paras = split_paragraphs(thought, min_chars=min_chars)
        assert "".join(p.text + p.sep for p in paras) == thought
        assert all(p.text.strip() for p in paras)
        assert all(p.sep.count("\n") >= 2 for p in paras[:-1]) and paras[-1].sep == ""
        if min_chars and len(paras) > 1:
            assert all(len(p.text) >= min_chars for p in paras)


def test_merging_reduces_paragraph_count(trace_rows):
    thought = split_thought(trace_rows[0].response).thought
    n0, n1 = len(split_paragraphs(thought)), len(split_paragraphs(thought, min_chars=500))
    assert n0 > 3 * n1 > 0


def test_paragraph_edge_cases():
    assert split_paragraphs("   \n\n ") == []
    assert [p.text for p in split_paragraphs("one")] == ["one"]
    paras = split_paragraphs("  a\n  \n\n\nb\n\nc")
    assert [(p.text, p.sep) for p in paras] == [("  a", "\n  \n\n\n"), ("b", "\n\n"), ("c", "")]
    # a short tail is merged backwards
    assert [p.text for p in split_paragraphs("aaaa\n\nbbbb\n\nc", min_chars=4)] == ["aaaa", "bbbb\n\nc"]
    # CRLF line ends: a trace written on Windows was one paragraph (one summary for the whole thought)
    crlf = "First.\r\n\r\nSecond line\r\nstill second.\r\n \r\n\r\nThird."
    paras = split_paragraphs(crlf)
    assert [(p.text, p.sep) for p in paras] == [
        ("First.", "\r\n\r\n"), ("Second line\r\nstill second.", "\r\n \r\n\r\n"), ("Third.", "")
    ]
    assert "".join(p.text + p.sep for p in paras) == crlf


def test_a_trace_with_windows_line_ends_splits_into_its_paragraphs():
    """A thought written with CRLF line ends ('a.\\r\\n\\r\\nb.') was one paragraph: the summariser summarised the
    whole thought once and LightThinker compressed it as one thought, without a word; now it splits as with LF."""
    crlf = "First step.\r\n\r\nSecond step.\r\n \r\n\r\nThird."
    paras = split_paragraphs(crlf)
    assert [(p.text, p.sep) for p in paras] == [("First step.", "\r\n\r\n"), ("Second step.", "\r\n \r\n\r\n"),
                                                ("Third.", "")]  # fmt: skip
    assert "".join(p.text + p.sep for p in paras) == crlf
    assert [p.text for p in split_paragraphs("a\r\nb\r\n\r\nc")] == ["a\r\nb", "c"]  # a single CRLF is no break


def test_insert_summaries_places_blocks_after_paragraphs():
    response = f"{tokens.BEGIN_THOUGHT}\n\nfirst para.\n\nsecond.\n\n{tokens.END_THOUGHT}\n\n{tokens.BEGIN_SOLUTION}x"
    split = split_thought(response)
    paras = split_paragraphs(split.thought)
    out = insert_summaries(split, paras, [" S1 ", "S2"])
    b, e = tokens.BEGIN_SUMMARY, tokens.END_SUMMARY
    assert out == (
        f"{tokens.BEGIN_THOUGHT}\n\nfirst para.\n\n{b}S1{e}\n\nsecond.\n\n{b}S2{e}\n\n{tokens.END_THOUGHT}\n\n"
        f"{tokens.BEGIN_SOLUTION}x"
    )
    with pytest.raises(ValueError):
        insert_summaries(split, paras, ["only one"])


def test_tracker_hand_built_sequence():
    B, E = 100, 101
    #        prompt(0..2) | R0: 3,4 | S0: 5..7 | R1: 8 | S1: 9,10 | open: 11,12
    ids = [1, 2, 3, 10, 11, B, 12, E, 13, B, E, 14, 15]
    segs = segments_from_ids(ids, B, E, start=3)
    assert [(s.regular, s.summary) for s in segs] == [(range(3, 5), range(5, 8)), (range(8, 9), range(9, 11))]
    assert list(segs[0].summary_content) == [6]
    assert list(segs[1].summary_content) == []


def test_tracker_is_incremental_and_tolerates_bad_delimiters():
    B, E = 7, 8
    tr = SegmentTracker(B, E, start=10)
    assert tr.feed(E) is None and tr.anomalies == 1  # end outside a summary: ignored
    assert tr.feed(1) is None
    tr.feed(B)
    assert tr.in_summary
    tr.feed(B)  # restart inside a summary
    assert tr.anomalies == 2
    seg = tr.feed(E)
    assert (seg.r_start, seg.r_end, seg.s_start, seg.s_end) == (10, 13, 13, 15)
    assert not tr.in_summary and tr.open_start == 15 and tr.length == 15


def test_boundaries_on_strings():
    for piece in [".", " .", "!", "?", "...", ":", "\n\n", "\n\n\n", ".\n\n", "x\n\ny", "done. ", "3."]:
        assert is_semantic_boundary(piece), piece
    for piece in ["a", ",", ";", "\n", " ", ".)", "<|end_of_summary|>", "x.y"]:
        assert not is_semantic_boundary(piece), piece


def test_boundaries_on_real_tokenizer_pieces(cache_dir):
    from zoomr.models import load_tokenizer

    tok = load_tokenizer(tiny_spec("qwen2"), cache_dir)
    table = boundary_table(tok)
    assert table.shape == (len(tok),)
    text = "So x = 5. Then y: 3! Is it? Well...\n\nNext para.\n\n\nAnd 3, then 4"
    ids = tok(text)["input_ids"]
    pieces = token_pieces(tok, ids)
    assert "".join(pieces) == text
    flagged = [p for p, i in zip(pieces, ids) if table[i]]
    # every sentence end and blank line is caught ("..." is split "..", ".\n\n"); "," and "\n" are not
    assert flagged == [".", ":", "!", "?", "..", ".\n\n", ".\n\n"]
    assert not table[tok.convert_tokens_to_ids(tokens.END_SUMMARY)]
