"""The recall testbed task: tokenizer, generator invariants (no shortcut), grader, curriculum."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from zoomr import tokens
from zoomr.schemas.checks import SettingsError
from zoomr.schemas.testbed import CurriculumSettings, TestbedData
from zoomr.testbed import vocab as tt
from zoomr.testbed.curriculum import Curriculum, copy_batch, max_length_at, scaled_data
from zoomr.testbed.grading import grade, load_test_problems, prompt_messages, script_ids, summarize
from zoomr.testbed.task import generate, paragraph_cost, problems, query_cost


@pytest.fixture(scope="module")
def tokenizer():
    return tt.build_tokenizer()


@pytest.fixture(scope="module")
def long_problems():
    return problems(TestbedData(trace_tokens=1024, summaries=True, query_form="cue"), 40, seed=3)


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
        w = p.response_words
        assert len(w) <= 1024
        assert p.n_paragraphs >= 8
        keys = [f.key for f in p.facts]
        assert len(set(keys)) == len(keys)  # a key is defined once
        asked = [q.fact.index for q in p.queries]
        assert len(set(asked)) == len(asked)  # a fact is queried at most once
        for f in p.facts:
            assert w[f.definition_pos - 1 : f.definition_pos + 1] == [tt.key(f.key), tt.value(f.value)]
        for q in p.queries:
            assert q.paragraph == 0 or q.fact.paragraph < q.paragraph  # only facts of earlier paragraphs
            # the cue "? k", the boundary ":", one more step "=", then the value
            assert w[q.answer_pos - 4 : q.answer_pos + 1] == [tt.QUERY, tt.key(q.fact.key), ":", "=", tt.value(q.fact.value)]
            assert w[q.cue_pos] == ":" and q.cue_pos == q.answer_pos - 2
            assert q.distance == q.answer_pos - q.fact.definition_pos > 0
        final = [q.fact.index for q in p.queries if q.paragraph == 0]
        unasked = sorted(set(f.index for f in p.facts) - set(asked[: len(asked) - len(final)]))
        assert final == unasked[: len(final)]  # the \boxed{} answer recalls the earliest unqueried facts
        assert w.count(tt.BREAK) == p.n_paragraphs
        # the model writes exactly the answers (summaries are the environment's by default)
        assert p.model_writes == [q.answer_pos for q in p.queries]


def test_reference_distances_reach_far(long_problems):
    d = [q.distance for p in long_problems for q in p.queries]
    far = sum(x > 256 for x in d) / len(d)
    assert far > 0.3, far
    assert sum(x < 64 for x in d) / len(d) > 0.1
    assert all(q.distance > 256 for p in long_problems for q in p.queries if q.paragraph == 0)


def test_no_shortcut_the_definition_is_the_only_copy_of_a_binding(long_problems):
    """Nothing but the fact's definition joins its key to its value: not the prompt, not a summary, not an
    earlier answer (a fact is queried once); so evicting the definition loses the fact."""
    for p in long_problems:
        w = p.response_words
        assert not any(x.startswith("k") or x.startswith("v") for x in p.prompt_words)
        for f in p.facts:
            k, v = tt.key(f.key), tt.value(f.value)
            before_answer = [i for i, x in enumerate(w[:-1]) if x == k and w[i + 1] == v]
            assert before_answer[0] == f.definition_pos - 1  # the definition comes first
            assert len(before_answer) <= 2  # and at most one answer repeats it, later
        # a summary names keys, never a value
        for i, x in enumerate(w):
            if x == tokens.BEGIN_SUMMARY:
                assert not any(y.startswith("v") for y in w[i + 1 : w.index(tokens.END_SUMMARY, i)])


def test_summaries_are_lossy_and_list_the_paragraphs_keys(long_problems):
    p = long_problems[0]
    w = p.response_words
    starts = [i for i, x in enumerate(w) if x == tokens.BEGIN_SUMMARY]
    assert len(starts) == p.n_paragraphs
    for n, i in enumerate(starts, 1):
        body = w[i + 1 : w.index(tokens.END_SUMMARY, i)]
        assert body == [tt.key(f.key) for f in p.facts if f.paragraph == n]
        assert w[w.index(tokens.END_SUMMARY, i) + 1] == tt.BREAK


def test_model_writes_summaries_marks_their_keys():
    cfg = TestbedData(trace_tokens=300, summaries=True, model_writes_summaries=True)
    p = generate(cfg, random.Random(2))
    w = p.response_words
    written = [w[i] for i in p.model_writes]
    n_summary = sum(1 for f in p.facts) + p.n_paragraphs  # every key and every end-of-summary marker
    assert len(written) == len(p.queries) + n_summary
    assert written.count(tokens.END_SUMMARY) == p.n_paragraphs
    assert tokens.BEGIN_SUMMARY not in written  # the environment opens the summary


@pytest.mark.parametrize("form", ["cue", "inline"])
def test_paragraph_cost_matches_rendering(form):
    cfg = TestbedData(trace_tokens=400, summaries=True, query_form=form)
    p = generate(cfg, random.Random(5))
    w = p.response_words
    para_tokens = w.index(tt.BOXED)
    shapes = []
    start = 0
    for n in range(1, p.n_paragraphs + 1):
        end = w.index(tt.BREAK, start)
        facts = sum(f.paragraph == n for f in p.facts)
        queries = sum(q.paragraph == n for q in p.queries)
        filler = sum(x.startswith("w") for x in w[start:end])
        shapes.append((facts, queries, filler))
        start = end + 1
    assert para_tokens == sum(paragraph_cost(f, q, fl, True, form) for f, q, fl in shapes)
    assert len(w) - para_tokens == 2 + query_cost(form) * sum(q.paragraph == 0 for q in p.queries)
    # the summary spans are the content rows (the keys) of each paragraph's summary
    assert [w[a:b] for a, b in p.summary_spans] == [[tt.key(f.key) for f in p.facts if f.paragraph == n] for n in range(1, p.n_paragraphs + 1)]
    assert all(w[a - 1] == tokens.BEGIN_SUMMARY and w[b] == tokens.END_SUMMARY for a, b in p.summary_spans)


def test_the_cue_boundary_is_the_only_new_boundary_and_the_inline_form_is_kept(tokenizer):
    """":" must be a ZoomR semantic boundary (A.3) and "=" must not: the recompute at ":" sees the key and its
    selection applies at "=", the step that predicts the value. ``query_form=inline`` is the old "? k v"."""
    from zoomr.segments import boundary_table

    table = boundary_table(tokenizer)
    vocab = tokenizer.get_vocab()
    assert table[vocab[":"]] and not table[vocab["="]]
    assert sorted(w for w, i in vocab.items() if table[i]) == sorted([":", "?", tt.BREAK])
    old = generate(TestbedData(trace_tokens=300, query_form="inline"), random.Random(4))
    for q in old.queries:
        assert old.response_words[q.answer_pos - 2 : q.answer_pos + 1] == [tt.QUERY, tt.key(q.fact.key), tt.value(q.fact.value)]
    rec = old.record("x")
    assert grade(rec, rec["response"])["correct"] and rec["answer"].split()[:1] == [tt.QUERY]
    with pytest.raises(ValueError, match="query_form"):
        generate(TestbedData(query_form="prose"), random.Random(0))


def _straddles(p, period: int) -> tuple[int, int]:
    """(facts whose value opens a block, cue queries whose value is predicted from a block the key is not in)."""
    facts = sum(f.definition_pos % period == 0 for f in p.facts)
    queries = sum(q.answer_pos % period in (1, 2) for q in p.queries)
    return facts, queries


def test_boundary_data_puts_facts_and_queries_across_block_boundaries():
    """``boundary_rate`` moves items onto a C-token block grid by choosing filler lengths in their ranges; the
    problems stay well formed, and rate 0 draws nothing (the default stream is unchanged)."""
    plain = problems(TestbedData(), 60, seed=5)
    assert [p.response_words for p in problems(TestbedData(boundary_period=128), 60, seed=5)] == [
        p.response_words for p in plain
    ]
    moved = problems(TestbedData(boundary_period=128, boundary_rate=1.0), 60, seed=5)
    natural = [sum(_straddles(p, 128)) for p in plain]
    boundary = [sum(_straddles(p, 128)) for p in moved]
    # 7 inner boundaries in 1,024 tokens: about one straddling item each, against ~1 per problem by chance
    assert sum(boundary) / len(boundary) > 5 > 2 > sum(natural) / len(natural)
    for p in moved:
        w = p.response_words
        assert len(w) <= 1024 and p.model_writes == [q.answer_pos for q in p.queries]
        for f in p.facts:
            assert w[f.definition_pos - 1 : f.definition_pos + 1] == [tt.key(f.key), tt.value(f.value)]
        for q in p.queries:
            assert w[q.answer_pos - 4 : q.answer_pos + 1] == [tt.QUERY, tt.key(q.fact.key), ":", "=", tt.value(q.fact.value)]
        paragraphs = " ".join(w).split(f" {tt.BREAK}")[:-1]
        for text in paragraphs:  # filler before the first key stays within [8, 32]
            words = text.split()
            first_key = next(i for i, x in enumerate(words) if x.startswith("k"))
            assert 8 <= first_key <= 32, words[:first_key]
    with pytest.raises(ValueError, match="boundary_period"):
        TestbedData(boundary_rate=0.5)
    with pytest.raises(ValueError, match="boundary_rate"):
        TestbedData(boundary_period=64, boundary_rate=1.5)


def test_a_curriculum_starting_too_short_for_the_data_is_refused_before_training():
    """start_tokens too short for one paragraph and the answer passed the trainer's checks; the first trace batch
    (after the copy and recall steps) raised, and a resumed run raised again at the same step."""
    from train.testbed_pretrain import check_method
    from zoomr.schemas.testbed import TestbedTrainMethod

    data = TestbedData(trace_tokens=256)
    with pytest.raises(SettingsError, match=r"method.curriculum.start_tokens=16: the curriculum's shortest traces are too "
                                            r"short for this data \(testbed.trace_tokens=16 is too short"):
        check_method(TestbedTrainMethod(curriculum=CurriculumSettings(start_tokens=16)), data)
    check_method(TestbedTrainMethod(), data)  # the default start (64 tokens) fits
    check_method(TestbedTrainMethod(curriculum=CurriculumSettings(start_tokens=100)), TestbedData(trace_tokens=60))


def test_invalid_configs_fail_clearly():
    with pytest.raises(ValueError, match="facts_per_paragraph"):
        generate(TestbedData(facts_per_paragraph=[0, 2]), random.Random(0))
    with pytest.raises(ValueError, match="too short"):
        generate(TestbedData(trace_tokens=20), random.Random(0))
    with pytest.raises(ValueError, match="n_keys"):
        generate(TestbedData(trace_tokens=16384), random.Random(0))
    with pytest.raises(ValueError, match="model_writes_summaries"):
        generate(TestbedData(model_writes_summaries=True), random.Random(0))
    with pytest.raises(ValueError, match="filler_after"):
        generate(TestbedData(filler_after=[5, 2]), random.Random(0))
    # ranges given as benchmark.options (untyped): a ValueError from randrange, a TypeError, True taken as 1
    for bad in ([3.5, 4], 3, ["a", "b"], [True, 2]):
        with pytest.raises(SettingsError, match=re.escape(f"testbed.facts_per_paragraph must be [lo, hi] of ints, got {bad!r}")):
            generate(TestbedData(facts_per_paragraph=bad), random.Random(0))


def test_grader_on_reference_and_corruptions():
    rec = load_test_problems(TestbedData(trace_tokens=512, summaries=True), 2)[0]
    ok = grade(rec, rec["response"])
    assert ok["correct"] and ok["recall_accuracy"] == 1.0 and ok["summaries_exact"] == 1.0
    words = rec["response"].split(" ")

    def corrupt(pos: int) -> str:
        bad = words[:]
        bad[pos] = "v31" if words[pos] != "v31" else "v30"
        return " ".join(bad)

    # a wrong final value: the answer is wrong, that fact's recall too
    final = next(q for q in rec["queries"] if q["final"])
    g = grade(rec, corrupt(final["answer_pos"]))
    assert not g["correct"] and [r["correct"] for r in g["recall"]].count(False) == 1
    # a wrong paragraph answer: recall drops, the final answer still stands
    mid = next(q for q in rec["queries"] if not q["final"])
    g = grade(rec, corrupt(mid["answer_pos"]))
    assert g["correct"] and g["recall_accuracy"] < 1
    # decoders that skip special tokens, or a transcript with the prompt, grade the same
    skipped = " ".join(w for w in words if w not in (tokens.BEGIN_SUMMARY, tokens.END_SUMMARY))
    assert grade(rec, skipped)["correct"]
    transcript = f"{tokens.IM_START} user {rec['prompt']} {tokens.IM_END} {tokens.IM_START} assistant {rec['response']} {tokens.IM_END}"
    assert grade(rec, transcript)["recall_accuracy"] == 1.0
    assert not grade(rec, "")["correct"]
    s = summarize([ok, g])
    assert s["answer_accuracy"] == 1.0 and s["problems"] == 2 and 0 < s["recall_all"] < 1


def test_script_marks_exactly_the_model_positions(tokenizer):
    rec = load_test_problems(TestbedData(trace_tokens=256), 1)[0]
    script = script_ids(rec, tokenizer)
    assert len(script) == rec["response_tokens"] + 1 and script[-1] == tokenizer.convert_tokens_to_ids(tokens.IM_END)
    assert [i for i, t in enumerate(script) if t is None] == rec["model_writes"]
    filled = [t if t is not None else tokenizer.convert_tokens_to_ids(w) for t, w in zip(script, rec["response"].split(" "))]
    assert filled == tokenizer(rec["response"], add_special_tokens=False).input_ids


def test_curriculum_lengths_and_batches(tokenizer):
    cur = CurriculumSettings()
    lengths = [max_length_at(s, 1000, 1024, cur) for s in range(0, 1000, 50)]
    assert lengths[0] == 64 and lengths[-1] == 1024 and lengths == sorted(lengths)
    short, full = scaled_data(TestbedData(), 64, cur), scaled_data(TestbedData(), 600, cur)
    assert short.filler_before == short.filler_after == [0, 0]
    assert full.filler_before == TestbedData().filler_before and full.filler_after == TestbedData().filler_after
    enc = tt.FastEncoder(tokenizer)
    cur = CurriculumSettings(copy_steps=4, recall_steps=2, copy_warmup_fraction=0.5)
    stream = Curriculum(TestbedData(trace_tokens=256, query_form="cue"), cur, total_steps=22, tokens_per_step=1024, enc=enc)
    kinds = [stream.batch(s).kind for s in range(14)]
    assert kinds[:6] == ["copy"] * 4 + ["recall"] * 2  # the warm-up phases
    assert kinds[6:14] == ["trace", "copy"] * 4  # then every other batch copies for half the 16 trace steps
    assert stream.batch(14).kind == stream.batch(15).kind == "trace"
    r = stream.batch(4 + 1)
    for row, lab in zip(r.input_ids.tolist(), r.labels.tolist()):
        for t, y in enumerate(lab):
            if y != -100:  # "? k : = v": the label at "=" is the value defined right after k's first occurrence
                k = row[t - 2]
                assert row[t - 3] == enc.ids[tt.QUERY] and row[t - 1 : t + 2] == [enc.ids[":"], enc.ids["="], y]
                assert row[row.index(k) + 1] == y and row.index(k) < t - 3
    b = stream.batch(14)
    assert b.kind == "trace" and (b.input_ids == stream.batch(14).input_ids).all()
    # labels are the next input token wherever they are set, and set exactly at the answers
    lab = b.labels[:, :-1]
    sel = lab != -100
    assert (lab[sel] == b.input_ids[:, 1:][sel]).all()
    assert ((b.labels != -100) == b.answer_mask).all()
    assert b.answer_mask.any() and (b.distances[b.answer_mask] > 0).all()
    c = copy_batch(cur, 2048, random.Random(0), enc, stream.pad_id)
    assert c.tokens >= 2048 and c.input_ids.shape[0] > 1
    for row, lab in zip(c.input_ids.tolist(), c.labels.tolist()):
        labelled = [t for t, y in enumerate(lab) if y != -100]
        n = len(labelled) + 1  # the block length: every repeat token but the first is a target
        end = labelled[-1] + 2
        assert row[end - n : end] == row[end - 2 * n : end - n]  # the block, then its repeat
        assert [lab[t] for t in labelled] == row[end - n + 1 : end]


@pytest.mark.parametrize("name", ["zoomr", "sumr"])
def test_eval_refuses_zoomr_and_sumr_on_testbed_traces_without_summaries(name):
    """``+method=zoomr`` on the plain testbed ran to the end (recall > 256 back 0.50): with no summary there is no
    segment to select, so the arm measured only its window; the traces with summaries pass."""
    from eval.tasks import get_task
    from eval.testbed_task import testbed_problems
    from zoomr.configs import method_config

    task, method = get_task("testbed"), method_config(name)
    opts = {"trace_tokens": 256, "n_test": 2, "query_form": "cue"}
    with pytest.raises(ValueError, match=rf"no summaries, so {name} has no segments .*summaries=true"):
        task.check_policy(testbed_problems(opts), method)
    task.check_policy(testbed_problems({**opts, "summaries": True}), method)
    task.check_policy(testbed_problems(opts), method_config("h2o"))  # other policies run as before


def test_paragraph_topics_a_summary_is_its_paragraphs_topic_and_a_query_names_it():
    """``paragraph_topics``: a paragraph opens with a topic word no fact uses, its summary is that word alone,
    a query names the topic of the fact's paragraph before the key; costs, grading and cue rows follow."""
    cfg = TestbedData(trace_tokens=1024, summaries=True, model_writes_summaries=True, paragraph_topics=True)
    p = generate(cfg, random.Random(3))
    w = p.response_words
    fact_keys = {tt.key(f.key) for f in p.facts}
    starts = [0] + [i + 1 for i, x in enumerate(w) if x == tt.BREAK][:-1]
    topics = [w[s] for s in starts]
    assert len(topics) == p.n_paragraphs and len(set(topics)) == p.n_paragraphs and not set(topics) & fact_keys
    assert [w[a:b] for a, b in p.summary_spans] == [[t] for t in topics]
    assert all(f.topic is not None and tt.key(f.topic) == topics[f.paragraph - 1] for f in p.facts)
    for q in p.queries:
        f = q.fact
        assert w[q.cue_first - 1 : q.answer_pos + 1] == [tt.QUERY, topics[f.paragraph - 1], tt.key(f.key), ":", "=", tt.value(f.value)]
        assert q.cue_pos == q.answer_pos - 2 and q.cue_first == q.cue_pos - 2
    # the model writes the answers and each summary's topic and end marker
    assert sorted(w[i] for i in p.model_writes if w[i].startswith("k")) == sorted(topics)
    # lengths: each paragraph's cost as rendered, within the bound
    shapes, start = [], 0
    for n in range(1, p.n_paragraphs + 1):
        end = w.index(tt.BREAK, start)
        shapes.append((sum(f.paragraph == n for f in p.facts), sum(q.paragraph == n for q in p.queries),
                       sum(x.startswith("w") for x in w[start:end])))  # fmt: skip
        start = end + 1
    assert w.index(tt.BOXED) == sum(paragraph_cost(f, q, fl, True, "cue", topics=True) for f, q, fl in shapes)
    assert len(w) <= cfg.trace_tokens and query_cost("cue", topics=True) == 6
    # the grader reads the key before ":" (not the topic after "?"); a wrong value is caught
    rec = p.record("t")
    assert grade(rec, rec["response"])["correct"] and grade(rec, rec["response"])["summaries_exact"] == 1.0
    final = next(q for q in rec["queries"] if q["final"])
    bad = w[:]
    bad[final["answer_pos"]] = "v31" if w[final["answer_pos"]] != "v31" else "v30"
    g = grade(rec, " ".join(bad))
    assert not g["correct"] and [r["correct"] for r in g["recall"]].count(False) == 1
    # the trainer's cues start at the topic: the pointer's at-key term and the cue view cover "t k :"
    from zoomr.summary_pointer import with_key_cues
    from zoomr.testbed.curriculum import encode_problem

    enc = tt.FastEncoder()
    ids, _, _, meta = encode_problem(p, enc)
    inv = {i: x for x, i in enc.ids.items()}
    for cue, q in zip(meta["cues"], p.queries):
        assert [inv[i] for i in ids[cue.start - 1 : cue.pos + 1]] == [tt.QUERY, topics[q.fact.paragraph - 1], tt.key(q.fact.key), ":"]
    extra = with_key_cues([meta["cues"]])[0][len(meta["cues"]) :]
    assert [c.pos for c in extra] == [c.pos - 2 for c in meta["cues"]]
    # without topics the problems are those of before (topics draw no randomness): same facts and values
    plain = generate(TestbedData(trace_tokens=1024, summaries=True), random.Random(3))
    assert [(f.key, f.value) for f in plain.facts][:10] == [(f.key, f.value) for f in p.facts][:10]
    with pytest.raises(ValueError, match="paragraph_topics"):
        generate(TestbedData(paragraph_topics=True, query_form="inline"), random.Random(0))


def test_eval_refuses_traces_in_a_query_format_the_model_was_not_trained_on(tmp_path):
    """A checkpoint trained on one query format ran on another to the end and scored near zero, silently: the
    summaries model (``? k : = v``) on ``paragraph_topics`` traces (``? t k : = v``), or the reverse. The
    evaluator now refuses before any run state, naming the field; the trained format passes."""
    import json
    import subprocess
    import sys
    from types import SimpleNamespace

    from eval.tasks import get_task
    from zoomr.testbed.checkpoint import DATA_FILE, format_differences

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / DATA_FILE).write_text(json.dumps({"summaries": True, "query_form": "cue"}))
    task = get_task("testbed")
    task.check_model(SimpleNamespace(options={"summaries": True}), str(ckpt))  # the trained format
    task.check_model(SimpleNamespace(options={"paragraph_topics": True}), "owner/hub-model")  # nothing to compare
    with pytest.raises(ValueError, match=r"paragraph_topics=True \(trained on False\)"):
        task.check_model(SimpleNamespace(options={"summaries": True, "paragraph_topics": True}), str(ckpt))
    assert format_differences(ckpt, TestbedData(query_form="inline")) == {"query_form": ("cue", "inline")}
    # through the real entry point, on the shipped model (cue format, no topics)
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "eval", "benchmark=testbed", "model=tiny-testbed",
         "model.hf_id=analysis/results/miniature/base_model", "++benchmark.options.paragraph_topics=true",
         "benchmark.problem_limit=1", "generation.max_new_tokens=1100", "logger=none", f"hydra.run.dir={run_dir}",
         f"run_dir={run_dir}"],
        cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "trained on another query format: benchmark.options paragraph_topics=True (trained on False)" in proc.stderr
    assert "Traceback" not in proc.stderr and not (run_dir / "config.json").exists()


def test_eval_refuses_a_test_seed_the_model_or_its_ancestors_trained_on(tmp_path):
    """Problem ``i`` of a stream is the same problem wherever it is drawn, so testing on a model's training seed
    tests it on its training problems. ``TestbedData`` caught only the default stream (``seed`` 0); a model
    trained on another stream, or fine-tuned from one (AbridgeKV's later stages train on seeds 1 and 2), was
    evaluated on its own training problems without a word. The chain is followed through each run directory's
    ``method.init_from`` (``config.json``)."""
    import json
    from types import SimpleNamespace

    from eval.tasks import get_task
    from zoomr.testbed.checkpoint import DATA_CONFIG_FILE, DATA_FILE, training_streams

    base, stage2 = tmp_path / "base" / "final", tmp_path / "stage2" / "final"
    for d in (base, stage2):
        d.mkdir(parents=True)
    (base / DATA_FILE).write_text(json.dumps({"seed": 7, "query_form": "cue"}))
    (stage2 / DATA_CONFIG_FILE).write_text(json.dumps({"seed": 1, "query_form": "cue"}))
    (stage2.parent / "config.json").write_text(json.dumps({"method": {"init_from": str(base)}}))
    assert training_streams(stage2) == {1: str(stage2), 7: str(base)}
    assert training_streams(tmp_path / "elsewhere") == {}  # nothing recorded (a hub model)
    task = get_task("testbed")
    task.check_model(SimpleNamespace(options={"test_seed": 1_000_003}), str(stage2))  # a held-out stream passes
    for seed in (1, 7):
        with pytest.raises(ValueError, match=rf"test_seed={seed} is the stream .* was trained on"):
            task.check_model(SimpleNamespace(options={"test_seed": seed}), str(stage2))
    # a cycle in the records (a run directory pointing at itself) ends the walk instead of looping
    (base.parent / "config.json").write_text(json.dumps({"method": {"init_from": str(stage2)}}))
    assert training_streams(stage2) == {1: str(stage2), 7: str(base)}
    # a fine-tune on other data (data=traces) records no testbed stream: its data.json raised TypeError in TestbedData
    traces = tmp_path / "traces" / "final"
    traces.mkdir(parents=True)
    (traces / DATA_CONFIG_FILE).write_text(json.dumps({"name": "traces", "loader": "data_prep.traces", "path": "x"}))
    assert training_streams(traces) == {}
    task.check_model(SimpleNamespace(options={"test_seed": 1_000_003}), str(traces))
    # a torn or edited record is named
    (base / DATA_FILE).write_text('{"seed": 7,')
    with pytest.raises(ValueError, match=f"{base / DATA_FILE}: not valid JSON"):
        training_streams(base)
    (base / DATA_FILE).write_text(json.dumps({"seed": 7, "colour": "red"}))
    with pytest.raises(ValueError, match="not the testbed data config the trainer writes .*colour"):
        training_streams(base)


def test_reading_a_fine_tunes_data_config_needs_no_trainer(tmp_path, monkeypatch):
    """The evaluator reads a fine-tune's ``data.json`` without importing the trainer's module (transformers'
    ``Trainer``): each testbed evaluation (the three arms at the end of ``+method=abridge``) spent seconds importing
    it, and under ``WANDB_MODE=offline`` printed transformers' ``[INFO] Running in WANDB offline mode``."""
    import json
    import sys

    from zoomr.testbed.checkpoint import DATA_CONFIG_FILE, testbed_record

    monkeypatch.setitem(sys.modules, "zoomr.abridge.trainer", None)  # importing it raises ImportError
    (tmp_path / DATA_CONFIG_FILE).write_text(json.dumps({"seed": 1, "query_form": "cue"}))
    assert testbed_record(tmp_path) == (tmp_path / DATA_CONFIG_FILE, {"seed": 1, "query_form": "cue"})


def test_a_trace_that_runs_out_of_keys_is_a_settings_error():
    """It was a ValueError: a traceback from every entry point (in eval, while generating the test problems)."""
    from zoomr.testbed.task import generate

    with pytest.raises(SettingsError, match="trace_tokens=1024 needs more than n_keys=40 facts: raise testbed.n_keys"):
        generate(TestbedData(trace_tokens=1024, n_keys=40), random.Random(0))
