"""LongBench (eval/longbench.py): every metric equals a value computed by hand on small fixed strings,
the loader reads a local directory in LongBench's layout, and prompts follow LongBench's pred.py."""

from __future__ import annotations

import json
import re
import sys
from types import SimpleNamespace

import pytest

from eval import longbench as lb
from tests.conftest import tiny_spec


def test_qa_f1_after_squad_normalisation():
    # pred -> "cat sat on mat" (4 tokens), gold -> "cat on mat" (3): overlap 3, P = 3/4, R = 1
    assert lb.qa_f1("The cat sat on the mat.", "a cat on a mat") == pytest.approx(2 * 0.75 / 1.75)
    assert lb.qa_f1("Paris", "paris!") == 1.0
    assert lb.qa_f1("London", "Paris") == 0.0
    assert lb.qa_f1("the", "Paris") == 0.0  # nothing left after normalisation


def test_qa_f1_zh_with_a_given_word_cutter():
    # characters as words: pred 北,京 (the full stop is punctuation), gold 北,京,市: P = 1, R = 2/3
    assert lb.qa_f1_zh("北京。", "北京市", cut=list) == pytest.approx(0.8)


def test_rouge_l_summary_level_union_lcs():
    # one sentence each: LCS "the cat" = 2 of 3 distinct words both ways
    assert lb.rouge_l("the cat sat", "the cat ate") == pytest.approx(2 / 3, abs=1e-7)
    # reference "a b c d e"; candidate sentences "a b x" and "a c e": LCS words {a, b} and {a, c, e}, union 4;
    # 5 distinct reference words, 5 distinct candidate words (a, b, x, c, e): R = P = 0.8
    assert lb.rouge_l("a b x. a c e.", "a b c d e.") == pytest.approx(0.8, abs=1e-7)
    assert lb.rouge_l("", "a b c") == 0.0
    assert lb.rouge_l("x y", "a b") == 0.0


def test_rouge_zh_cuts_words_first():
    assert lb.rouge_zh("我爱北京", "我爱上海", cut=list) == pytest.approx(0.5, abs=1e-7)


def test_classification_with_longbench_partial_credit():
    classes = ["City", "Country", "Description", "Description of something"]
    assert lb.classification("Type: City", "City", all_classes=classes) == 1.0
    assert lb.classification("City or Country", "City", all_classes=classes) == 0.5
    assert lb.classification("Country", "City", all_classes=classes) == 0.0
    # "Description" is a proper substring of the gold: not counted against it
    gold = "Description of something"
    assert lb.classification("Description of something", gold, all_classes=classes) == 1.0


def test_retrieval_and_count_are_precision_of_the_numbers_named():
    assert lb.retrieval("Paragraph 3", "Paragraph 3") == 1.0
    assert lb.retrieval("Paragraph 3, or maybe Paragraph 5", "Paragraph 3") == 0.5
    assert lb.retrieval("I cannot tell", "Paragraph 3") == 0.0
    assert lb.retrieval_zh("段落2，段落7", "段落2") == 0.5
    assert lb.count("There are 4 unique paragraphs: 4.", "4") == 1.0
    assert lb.count("3 or 4", "4") == 0.5
    assert lb.count("12", "2") == 0.0  # whole numbers, not digits


def test_edit_similarity_of_the_first_code_line():
    # first line without ` # //: "x = foo(1)" vs "x = foo(2)": 9 of 10 characters match -> 2*9/20 = 0.9
    assert lb.code_sim("```python\n# the call\nx = foo(1)\ny = 2", "x = foo(2)") == pytest.approx(0.9)
    assert lb.fuzz_ratio("abc", "abc") == 100 and lb.fuzz_ratio("abc", "") == 0
    assert lb.fuzz_ratio("abcd", "abxy") == 50


def test_score_takes_the_best_answer_and_the_first_line_where_longbench_does():
    assert lb.score("hotpotqa", "Bob", ["Alice", "Bob"]) == 1.0
    classes = ["City", "Country"]
    assert lb.score("trec", "City\nCountry", ["City"], classes) == 1.0  # first line only
    assert lb.score("lsht", "\nCountry", ["Country"], classes) == 1.0
    assert lb.score("passage_count", "2\n3", ["2"]) == 0.5  # not a first-line subset
    assert set(lb.SUBSETS) == set(lb.prompts()) == set(lb.budgets()) and len(lb.SUBSETS) == 21


def test_averages_with_and_without_trec():
    avg = lb.averages({"trec": 80.0, "qasper": 20.0, "lcc": 50.0})
    assert avg == {"average": 50.0, "average_without_trec": 35.0}


@pytest.fixture(scope="module")
def tokenizer(cache_dir):
    from zoomr.models import load_tokenizer

    return load_tokenizer(tiny_spec("qwen2"), cache_dir)


def _write(tmp_path, subset: str, rows: list[dict]) -> None:
    (tmp_path / f"{subset}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_local_directory_prompts_and_truncation(tmp_path, tokenizer):
    row = {"input": "Who is older?", "context": "Passage 1:\nAlice was born in 1900.", "answers": ["Alice"],
           "all_classes": None, "length": 9, "_id": "h1"}  # fmt: skip
    _write(tmp_path, "hotpotqa", [row, {**row, "_id": "h2"}])
    _write(
        tmp_path, "trec", [{**row, "answers": ["Human"], "all_classes": ["Human", "Location"], "_id": "t1"}]
    )
    bench = SimpleNamespace(
        sources=["hotpotqa", "trec"], options={"data_dir": str(tmp_path)}, problem_limit=1
    )
    gen = SimpleNamespace(system_prompt=None, enable_thinking=None)
    problems = lb.load(bench, tokenizer, gen)
    assert [p.id for p in problems] == ["hotpotqa/h1", "trec/t1"]
    qa, trec = problems
    plain = lb.prompts()["hotpotqa"].format(**row)
    assert qa.meta["prompt"] != plain and plain in qa.meta["prompt"]  # through the chat template
    assert trec.meta["prompt"] == lb.prompts()["trec"].format(**row)  # few-shot subsets: raw text
    assert qa.meta["max_new_tokens"] == 32 and trec.meta["all_classes"] == ["Human", "Location"]
    long = " ".join(["word"] * 400)
    cut = lb.truncate_middle(long, tokenizer, 100)
    assert len(tokenizer(cut, add_special_tokens=False).input_ids) <= 102 and cut.startswith("word")
    assert lb.truncate_middle(long, tokenizer, None) == long
    with pytest.raises(FileNotFoundError, match="musique"):
        lb.load_rows("musique", str(tmp_path))
    with pytest.raises(ValueError, match="unknown LongBench subset"):
        lb.load_rows("squad", str(tmp_path))


def test_chinese_subsets_without_jieba_are_refused_before_decoding(tmp_path, tokenizer, monkeypatch):
    """The default sources decoded narrativeqa, qasper and multifieldqa_en, then stopped with an ImportError at the
    first multifieldqa_zh sample (run directory and fingerprint written); now refused by load, naming the subsets."""
    monkeypatch.setitem(sys.modules, "jieba", None)  # not installed
    _write(tmp_path, "hotpotqa", [{"input": "q", "context": "c", "answers": ["a"], "all_classes": None, "_id": "h"}])
    gen = SimpleNamespace(system_prompt=None, enable_thinking=None)
    bench = SimpleNamespace(sources=["hotpotqa", "dureader", "multifieldqa_zh"], options={"data_dir": str(tmp_path)},
                            problem_limit=None)  # fmt: skip
    with pytest.raises(ValueError, match=re.escape("LongBench subsets ['dureader', 'multifieldqa_zh'] are scored on "
                                                   "words cut by jieba, which is not installed")):  # fmt: skip
        lb.load(bench, tokenizer, gen)
    assert len(lb.load(SimpleNamespace(**{**vars(bench), "sources": ["hotpotqa"]}), tokenizer, gen)) == 1


@pytest.mark.parametrize("limit", [0, 1, -5, 2.5, "512", True])
def test_a_prompt_limit_that_cannot_truncate_is_refused(tmp_path, tokenizer, limit):
    """``max_prompt_tokens=0`` or 1 kept the whole prompt (``ids[-0:]``) and a negative one doubled its middle."""
    _write(tmp_path, "hotpotqa", [{"input": "q", "context": "c", "answers": ["a"], "all_classes": None, "_id": "h"}])
    bench = SimpleNamespace(sources=["hotpotqa"], options={"data_dir": str(tmp_path), "max_prompt_tokens": limit},
                            problem_limit=None)  # fmt: skip
    gen = SimpleNamespace(system_prompt=None, enable_thinking=None)
    with pytest.raises(ValueError, match=re.escape(f"benchmark.options.max_prompt_tokens={limit!r}: give an integer >= 2")):
        lb.load(bench, tokenizer, gen)
    assert len(lb.load(SimpleNamespace(**{**vars(bench), "options": {**bench.options, "max_prompt_tokens": 2}}),
                       tokenizer, gen)) == 1  # fmt: skip


def test_a_problem_id_repeated_in_a_data_file_is_refused_before_decoding(tmp_path, tokenizer):
    """Two rows with one ``_id`` were two problems with one id: both decoded, and writing the second's row stopped
    the run with ``result for ('hotpotqa/h1', 0) already written`` after config.json and the first row."""
    from eval.steps import load_problems
    from eval.tasks import get_task
    from zoomr.schemas.eval import BenchmarkConfig

    row = {"input": "q", "context": "c", "answers": ["a"], "all_classes": None, "_id": "h1"}
    _write(tmp_path, "hotpotqa", [row, {**row, "_id": "h2"}, row])
    bench = BenchmarkConfig(name="longbench", task="longbench", sources=["hotpotqa"], options={"data_dir": str(tmp_path)})
    gen = SimpleNamespace(system_prompt=None, enable_thinking=None, max_new_tokens=32)
    with pytest.raises(ValueError, match=r"problem ids \['hotpotqa/h1'\] appear more than once"):
        load_problems(get_task("longbench"), bench, tokenizer, gen)
    _write(tmp_path, "hotpotqa", [row, {**row, "_id": "h2"}])
    assert [p.id for p in load_problems(get_task("longbench"), bench, tokenizer, gen)] == ["hotpotqa/h1", "hotpotqa/h2"]


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"answers": "Alice"}, "'answers' is \"Alice\", not a non-empty list"),  # was scored as ['A', 'l', 'i', 'c', 'e']
        ({"answers": []}, "'answers' is \\[\\], not a non-empty list"),  # was a score of 0 whatever the output
        ({"answers": None}, "'answers' is null"),  # was a TypeError traceback
        ({"answers": [None]}, "'answers' holds null, not a gold answer"),  # was the gold "None"
        ({"context": None}, "no field 'context' \\(or it is null\\); the hotpotqa prompt needs it"),  # was a KeyError
    ],
)
def test_a_row_without_usable_answers_or_prompt_fields_is_refused_naming_its_line(tmp_path, tokenizer, bad, message):
    from zoomr.jsonl import BadRowError

    row = {"input": "q", "context": "c", "answers": ["Alice"], "all_classes": None, "_id": "h1"}
    _write(tmp_path, "hotpotqa", [row, {k: v for k, v in {**row, **bad, "_id": "h2"}.items() if v is not None}])
    bench = SimpleNamespace(sources=["hotpotqa"], options={"data_dir": str(tmp_path)}, problem_limit=None)
    with pytest.raises(BadRowError, match=r"hotpotqa\.jsonl line 2: " + message):
        lb.load(bench, tokenizer, SimpleNamespace(system_prompt=None, enable_thinking=None))


@pytest.mark.parametrize(
    "subset, bad, message",
    [
        ("trec", {"all_classes": None}, "'all_classes' is null, not the list of class names trec is scored against"),
        ("lsht", {"all_classes": []}, r"'all_classes' is \[\], not the list"),
        ("passage_retrieval_en", {"answers": ["Alice"]}, r"the gold answer \"Alice\" names no paragraph"),
    ],
)
def test_a_row_its_metric_cannot_score_is_refused_before_decoding(tmp_path, tokenizer, subset, bad, message):
    """A classification row without its classes scored 0 whatever the output; a retrieval gold naming no paragraph
    was an IndexError traceback when the first output was scored, after decoding."""
    from zoomr.jsonl import BadRowError

    row = {"input": "q", "context": "c", "answers": ["Paragraph 2"], "all_classes": ["Paragraph 2", "x"], "_id": "a"}
    _write(tmp_path, subset, [row, {**row, **bad, "_id": "b"}])
    bench = SimpleNamespace(sources=[subset], options={"data_dir": str(tmp_path)}, problem_limit=None)
    gen = SimpleNamespace(system_prompt=None, enable_thinking=None)
    with pytest.raises(BadRowError, match=rf"{subset}\.jsonl line 2: {message}"):
        lb.load(bench, tokenizer, gen)
    _write(tmp_path, subset, [row])
    assert lb.score(subset, "Paragraph 2", *[(p.meta["answers"], p.meta["all_classes"]) for p in lb.load(bench, tokenizer, gen)][0]) == 1.0


def test_an_empty_subset_file_is_refused_not_left_out_of_the_averages(tmp_path, tokenizer):
    from zoomr.jsonl import BadRowError

    _write(tmp_path, "hotpotqa", [{"input": "q", "context": "c", "answers": ["a"], "_id": "h"}])
    _write(tmp_path, "qasper", [])
    bench = SimpleNamespace(sources=["hotpotqa", "qasper"], options={"data_dir": str(tmp_path)}, problem_limit=None)
    with pytest.raises(BadRowError, match=r"LongBench qasper: .*qasper\.jsonl holds no rows"):
        lb.load(bench, tokenizer, SimpleNamespace(system_prompt=None, enable_thinking=None))
