"""Text the models read that holds a special token's string literally (a problem quoting ``<|im_end|>``, a trace
quoting ``<|pause_3|>``): refused naming the row, never tokenized as the special token without a word."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from tests.conftest import tiny_spec


@pytest.fixture(scope="module")
def tokenizer(cache_dir):
    from zoomr.models import load_tokenizer

    return load_tokenizer(tiny_spec("qwen2"), cache_dir)


def test_a_problem_quoting_a_special_token_is_refused_naming_it_before_decoding(tokenizer):
    """A math problem quoting '<|im_end|>' was rendered into a prompt whose user turn ended at the quote (the tokenizer
    read it as the token), decoded and graded without a word; now load_problems names the problem and the string."""
    from eval.benchmarks import Problem
    from eval.steps import load_problems
    from eval.tasks import get_task
    from zoomr.schemas.eval import GenerationConfig

    plain = Problem("p/1", "If 0<|x|<1 and <x> = 2, what is x?", "1", "p")  # look-alikes are plain text
    quoting = Problem("p/2", "The model wrote '<|im_end|>' then '<|pause_3|>'. Count the words.", "2", "p")
    task = get_task("math")
    bench = SimpleNamespace(name="mine", options=None)
    loaded = lambda problems: lambda *_: problems  # noqa: E731
    assert load_problems(SimpleNamespace(load=loaded([plain]), check=task.check, prompt=task.prompt), bench,
                         tokenizer, GenerationConfig()) == [plain]  # fmt: skip
    with pytest.raises(ValueError, match=re.escape("problem p/2: the user message holds '<|im_end|>', '<|pause_3|>' "
                                                   "literally")):  # fmt: skip
        load_problems(SimpleNamespace(load=loaded([plain, quoting]), check=task.check, prompt=task.prompt), bench,
                      tokenizer, GenerationConfig())  # fmt: skip
    with pytest.raises(ValueError, match=re.escape("generation.system_prompt holds '<|endoftext|>'")):
        load_problems(SimpleNamespace(load=loaded([plain]), check=task.check, prompt=task.prompt), bench, tokenizer,
                      GenerationConfig(system_prompt="Stop at <|endoftext|>."))  # fmt: skip


@pytest.mark.parametrize("subset", ["hotpotqa", "trec"])  # through the chat template, and raw text
def test_a_longbench_context_quoting_a_special_token_is_refused_naming_the_row(tmp_path, tokenizer, subset):
    """A context holding '<|endoftext|>' was read as the end-of-text token (a raw subset's too), or dropped without a
    word by truncate_middle's decode when the prompt was cut."""
    from eval import longbench as lb

    row = {"input": "q", "context": "c", "answers": ["a"], "all_classes": ["a"], "_id": "h1"}
    bad = {**row, "context": "tokenizer.eos = '<|endoftext|>'", "_id": "h2"}
    (tmp_path / f"{subset}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in (row, bad)))
    gen = SimpleNamespace(system_prompt=None, enable_thinking=None)
    for limit in (None, 4):
        bench = SimpleNamespace(sources=[subset], options={"data_dir": str(tmp_path), "max_prompt_tokens": limit},
                                problem_limit=None)  # fmt: skip
        with pytest.raises(ValueError, match=re.escape(f"LongBench {subset} row 1 (id h2): the prompt holds "
                                                       "'<|endoftext|>' literally")):  # fmt: skip
            lb.load(bench, tokenizer, gen)


def test_a_trace_quoting_a_special_token_is_skipped_and_counted_naming_the_row(tmp_path, caplog, tokenizer):
    """A trace whose response quoted '<|im_end|>' trained an end of turn mid-response (SFT), one quoting '<|pause_3|>'
    trained a pause token (an AbridgeKV code row) as a response token, '<|splitter|>' ended a LightThinker thought,
    and a question quoting one ended the user turn: each row was trained on without a word. Now skipped and counted
    like the loader's other unusable rows, with a warning naming it; the response's own tags (thought, solution,
    the summaries data_prep.summarize inserts) are kept."""
    from data_prep.traces import load_trace_rows, sft_dataset

    own = "<|begin_of_thought|>a\n\nb<|begin_of_summary|>s<|end_of_summary|><|end_of_thought|><|begin_of_solution|>1<|end_of_solution|>"  # noqa: E501
    rows = [
        {"idx": "ok", "question": "If 0<|x|<1, is x < 1?", "code": [own]},
        {"idx": "r", "question": "Q", "code": ["<|begin_of_thought|>then '<|im_end|>'<|end_of_thought|>"]},
        {"idx": "q", "question": "What does <|pause_3|> do?", "code": [own]},
        {"idx": "s", "question": "Q", "code": ["<|begin_of_thought|>x <|splitter|> y<|end_of_thought|>"]},
        {"idx": "eot", "question": "Stop at <|eot_id|>.", "code": [own]},  # a tokenizer's own special token
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kept, report = load_trace_rows(path=str(path), special=["<|eot_id|>"])
    assert [r.id for r in kept] == ["ok"] and kept[0].response == own
    assert report.defects["special_token_in_response"] == 2 and report.defects["special_token_in_question"] == 2
    assert "row 2 (id 'r') skipped: its response holds '<|im_end|>' literally" in caplog.text
    assert "row 3 (id 'q') skipped: its question holds '<|pause_3|>' literally" in caplog.text
    assert [r["id"] for r in sft_dataset({"source": "local", "path": str(path)}, tokenizer)] == ["ok", "eot"]


def test_a_trace_with_a_stray_summary_delimiter_is_skipped_and_counted(tmp_path):
    """A response holding a summary delimiter that opens or closes nothing (a raw trace quoting '<|end_of_summary|>',
    a summary block cut by hand) was kept: the summariser summarised around it and zoomr_sft trained the model to
    write malformed summaries; now counted as unpaired_summary_tags and skipped (paired blocks are kept)."""
    from data_prep.traces import load_trace_rows

    b, e = "<|begin_of_summary|>", "<|end_of_summary|>"
    thought = lambda body: f"<|begin_of_thought|>{body}<|end_of_thought|><|begin_of_solution|>1<|end_of_solution|>"  # noqa: E731
    rows = [{"idx": "ok", "question": "Q", "code": [thought(f"a\n\n{b}s{e}\n\nb\n\n{b}t{e}")]},
            {"idx": "end", "question": "Q", "code": [thought(f"a {e} b")]},
            {"idx": "open", "question": "Q", "code": [thought(f"a\n\n{b}s{e}\n\nb\n\n{b}t")]}]  # fmt: skip
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kept, report = load_trace_rows(path=str(path))
    assert [r.id for r in kept] == ["ok"] and report.defects["unpaired_summary_tags"] == 2


def test_a_kvzap_document_quoting_a_special_token_is_tokenized_as_text(tmp_path, tokenizer):
    """A pretraining document holding '<|endoftext|>' (a GPT-2 style dump's separator) or '<|im_end|>' was tokenized
    as those special tokens inside the KVzip context (a turn ended mid-document, scored and learned from); now every
    document is tokenized as its text, and a document without such strings keeps its ids."""
    from data_prep.kvzap_pairs import plan_documents
    from zoomr.schemas.kvzap import KVzapPairsPipeline, TextSource

    plain = " ".join(["the cat sat on the mat."] * 30)
    (tmp_path / "docs.txt").write_text(f"{plain}\n{plain} <|endoftext|> {plain} <|im_end|> end\n")
    source = TextSource(name="web", path=str(tmp_path / "docs.txt"), format="lines")
    pipe = KVzapPairsPipeline(sources=[source], out_dir=str(tmp_path), min_tokens=20, max_tokens=10_000,
                              max_docs_per_subset=5, val_docs_per_subset=1)  # fmt: skip
    docs = plan_documents([source], tokenizer, pipe, seed=0)
    specials = {tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_end|>")}
    assert len(docs) == 2 and not any(specials & set(d.ids) for d in docs)
    quoting = max(docs, key=lambda d: len(d.ids))
    assert tokenizer.decode(quoting.ids) == f"{plain} <|endoftext|> {plain} <|im_end|> end"
    assert min(docs, key=lambda d: len(d.ids)).ids == tokenizer(plain, add_special_tokens=False).input_ids
