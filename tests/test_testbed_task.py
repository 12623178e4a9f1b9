"""The recall testbed task: tokenizer, generator invariants (no shortcut), grader, curriculum."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from data_prep import testbed_tokenizer as tt
from data_prep.testbed import generate, paragraph_cost, problems
from data_prep.testbed_curriculum import Curriculum, copy_batch, max_length_at, scaled_data
from data_prep.testbed_grading import grade, load_test_problems, prompt_messages, summarize
from zoomr import tokens
from zoomr.schemas.testbed import CurriculumSettings, TestbedData


@pytest.fixture(scope="module")
def tokenizer():
    return tt.build_tokenizer()


@pytest.fixture(scope="module")
def long_problems():
    return problems(TestbedData(trace_tokens=1024, summaries=True), 40, seed=3)


def test_tokenizer_has_every_special_token_and_round_trips(tokenizer, tmp_path):
    from transformers import AutoTokenizer

    from zoomr.tokenizer import special_token_ids

    special_token_ids(tokenizer)  # raises naming a missing token
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    p = generate(TestbedData(trace_tokens=256, summaries=True), random.Random(0))
    text = " ".join(p.prompt_words + p.response_words)
    ids = tokenizer(text)["input_ids"]
    assert loaded(text)["input_ids"] == ids
    assert tokenizer.unk_token_id not in ids
    assert len(ids) == len(p.prompt_words) + len(p.response_words)  # one word, one token ("\n\n" included)


def test_fast_encoder_matches_chat_template(tokenizer):
    p = generate(TestbedData(trace_tokens=300, summaries=True), random.Random(1))
    msgs = [{"role": "user", "content": " ".join(p.prompt_words)}, {"role": "assistant", "content": " ".join(p.response_words)}]
    ref = tokenizer.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ids, start = tt.FastEncoder(tokenizer).chat(p.prompt_words, p.response_words)
    assert ref["input_ids"] == ids
    assert ref["assistant_masks"].index(1) == start and sum(ref["assistant_masks"]) == len(ids) - start
    gen_prompt = tokenizer.apply_chat_template(prompt_messages({"prompt": msgs[0]["content"]}), add_generation_prompt=True, tokenize=True, return_dict=True)
    assert gen_prompt["input_ids"] == ids[:start]


def test_generation_is_a_function_of_the_seed():
    cfg = TestbedData(trace_tokens=512)
    a = generate(cfg, random.Random("x"))
    assert a.response_words == generate(cfg, random.Random("x")).response_words
    assert a.response_words != generate(cfg, random.Random("y")).response_words
    assert [r["id"] for r in load_test_problems(cfg, 3)] == [r["id"] for r in load_test_problems(cfg, 3)]


def test_structure_and_lengths(long_problems):
    for p in long_problems:
        assert len(p.response_words) <= 1024
        assert p.n_paragraphs >= 8
        keys = [f.key for f in p.facts]
        assert len(set(keys)) == len(keys)  # a key is defined once
        asked = [q.fact.index for q in p.queries]
        assert len(set(asked)) == len(asked)  # a fact is queried at most once
        for q in p.queries:
            assert q.paragraph == 0 or q.fact.paragraph < q.paragraph  # only facts of earlier paragraphs
            assert p.response_words[q.definition_pos] == tt.value(q.fact.value)
            assert p.response_words[q.answer_pos] == tt.value(q.fact.value)
            assert p.response_words[q.answer_pos - 1] == tt.query(q.fact.key)
        final = [q.fact.index for q in p.queries if q.paragraph == 0]
        unasked = sorted(set(f.index for f in p.facts) - set(asked[: len(asked) - len(final)]))
        assert final == unasked[: len(final)]  # the \boxed{} answer recalls the earliest unqueried facts
        assert p.response_words.count(tt.BREAK) == p.n_paragraphs


def test_reference_distances_reach_far(long_problems):
    d = [q.distance for p in long_problems for q in p.queries]
    far = sum(x > 256 for x in d) / len(d)
    assert far > 0.3, far
    assert all(q.distance > 256 for p in long_problems for q in p.queries if q.paragraph == 0)


def test_no_shortcut_prompt_never_binds_a_key_to_a_value(long_problems):
    """The prompt's value list holds no keys and its plan no values; the binding exists only in the trace."""
    for p in long_problems:
        plan_at = p.prompt_words.index(tt.PLAN_HEADER)
        value_list, plan = p.prompt_words[1:plan_at], p.prompt_words[plan_at + 1 :]
        assert all(w.startswith("#") or w.startswith("v") for w in value_list)
        assert not any(w.startswith("v") or w.startswith("#") for w in plan)
        # the value list is shuffled: its order is not the definition order
        order = [int(w[1:]) for w in value_list[0::2]]
        assert order != sorted(order)
        # in the response, a key is followed by its value only in its definition
        for f in p.facts:
            k = tt.key(f.key)
            follows = [p.response_words[i + 1] for i, w in enumerate(p.response_words[:-1]) if w == k]
            assert follows.count(tt.value(f.value)) == 1


def test_summaries_are_lossy_and_name_the_paragraph(long_problems):
    p = long_problems[0]
    w = p.response_words
    starts = [i for i, x in enumerate(w) if x == tokens.BEGIN_SUMMARY]
    assert len(starts) == p.n_paragraphs
    for n, i in enumerate(starts, 1):
        body = w[i + 1 : w.index(tokens.END_SUMMARY, i)]
        assert body[0] == tt.paragraph(n)
        assert body[1:] == [tt.key(f.key) for f in p.facts if f.paragraph == n]
        assert not any(x.startswith("v") for x in body)


def test_paragraph_cost_matches_rendering():
    cfg = TestbedData(trace_tokens=400, summaries=True)
    p = generate(cfg, random.Random(5))
    para_tokens = len(p.response_words) - 2 - 2 * cfg.final_queries
    assert para_tokens == sum(
        paragraph_cost(n, q, f, True)
        for n, q, f in _paragraph_shapes(p)
    )


def _paragraph_shapes(p):
    w = p.response_words
    out = []
    for n in range(1, p.n_paragraphs + 1):
        facts = sum(f.paragraph == n for f in p.facts)
        queries = sum(q.paragraph == n for q in p.queries)
        start = w.index(tt.paragraph(n))
        filler = sum(x.startswith("w") for x in w[start : w.index(tt.BREAK, start)])
        out.append((facts, queries, filler))
    return out


def test_invalid_configs_fail_clearly():
    with pytest.raises(ValueError, match="facts_per_paragraph"):
        generate(TestbedData(facts_per_paragraph=[0, 2]), random.Random(0))
    with pytest.raises(ValueError, match="too short"):
        generate(TestbedData(trace_tokens=20), random.Random(0))
    with pytest.raises(ValueError, match="vocabulary"):
        generate(TestbedData(trace_tokens=16384, filler=[0, 0]), random.Random(0))


def test_grader_on_reference_and_corruptions():
    rec = load_test_problems(TestbedData(trace_tokens=512, summaries=True), 2)[0]
    ok = grade(rec, rec["response"])
    assert ok["correct"] and ok["trace_exact"] and ok["recall_accuracy"] == 1.0 and ok["definitions_correct"] == 1.0
    words = rec["response"].split()
    # a wrong final value: the answer is wrong, that fact's recall too
    final = next(q for q in rec["queries"] if q["final"])
    i = len(words) - 1 - words[::-1].index(tt.query(int(final["key"][1:])))
    bad = words[:]
    bad[i + 1] = "v31" if words[i + 1] != "v31" else "v30"
    g = grade(rec, " ".join(bad))
    assert not g["correct"] and g["recall_accuracy"] < 1 and not g["trace_exact"]
    assert [r["correct"] for r in g["recall"]].count(False) == 1
    # a wrong paragraph answer: recall drops, the final answer still stands
    mid = next(q for q in rec["queries"] if not q["final"])
    j = words.index(tt.query(int(mid["key"][1:])))
    bad = words[:]
    bad[j + 1] = "v31" if words[j + 1] != "v31" else "v30"
    g = grade(rec, " ".join(bad))
    assert g["correct"] and g["recall_accuracy"] < 1
    # decoders that skip special tokens, or a transcript with the prompt, grade the same
    skipped = " ".join(w for w in words if w not in (tokens.BEGIN_SUMMARY, tokens.END_SUMMARY))
    assert grade(rec, skipped)["correct"]
    transcript = f"{tokens.IM_START} user {rec['prompt']} {tokens.IM_END} {tokens.IM_START} assistant {rec['response']} {tokens.IM_END}"
    assert grade(rec, transcript)["trace_exact"]
    assert not grade(rec, "")["correct"]
    s = summarize([ok, g])
    assert s["answer_accuracy"] == 1.0 and s["problems"] == 2 and 0 < s["recall_all"] < 1


def test_curriculum_lengths_and_batches(tokenizer):
    cur = CurriculumSettings()
    lengths = [max_length_at(s, 1000, 1024, cur) for s in range(0, 1000, 50)]
    assert lengths[0] == 64 and lengths[-1] == 1024 and lengths == sorted(lengths)
    assert scaled_data(TestbedData(filler=[12, 40]), 64, cur).filler == [0, 0]
    assert scaled_data(TestbedData(filler=[12, 40]), 600, cur).filler == [12, 40]
    enc = tt.FastEncoder(tokenizer)
    stream = Curriculum(TestbedData(trace_tokens=256), cur, total_steps=20, tokens_per_step=1024, enc=enc)
    b = stream.batch(10)
    assert b.kind == "trace" and (b.input_ids == stream.batch(10).input_ids).all()
    # labels are the next input token wherever they are set; answers are labelled and have distances
    lab = b.labels[:, :-1]
    sel = lab != -100
    assert (lab[sel] == b.input_ids[:, 1:][sel]).all()
    assert b.answer_mask.any() and (b.distances[b.answer_mask] > 0).all()
    assert Counter(stream.batch(1).kind for _ in range(1))["copy"] == 1  # warm-up: odd early steps copy
    c = copy_batch(cur, 512, random.Random(0), enc, stream.pad_id)
    row, n = c.input_ids[0], c.input_ids.shape[1] // 2
    assert (row[:n] == row[n:]).all() and (c.labels[0, : n - 1] == -100).all()
