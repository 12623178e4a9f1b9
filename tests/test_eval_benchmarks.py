"""Benchmarks load offline with stable unique ids; the suite deduplicates; GPQA never touches the disk
in plain text; prompts use the model's chat template."""

from __future__ import annotations

import os
import sys
from collections import Counter

import pytest
from hydra import compose, initialize_config_dir

from eval.benchmarks import SOURCES, load_benchmark, load_problems, load_source
from eval.math_tasks import MATH_INSTRUCTION
from eval.tasks import render, user_message
from zoomr.entry import CONF_DIR
from zoomr.paths import REPO_ROOT
from zoomr.schemas import register_with_hydra, to_dataclass
from zoomr.schemas.eval import BenchmarkConfig

register_with_hydra()
DATA = "eval/data/benchmarks"


def _benchmark(name: str, *overrides: str) -> BenchmarkConfig:
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("eval", overrides=[f"benchmark={name}", *overrides])
    return to_dataclass(BenchmarkConfig, cfg.benchmark)


@pytest.mark.parametrize(
    "name,count",
    [
        ("math500", 500),
        ("aime24", 30),
        ("aime25", 30),
        ("gpqa_diamond", 198),
        ("suite", 303),
        ("aime25_hmmt25", 60),
    ],
)
def test_benchmark_configs_load(name, count):
    problems = load_benchmark(_benchmark(name))
    assert len(problems) == count
    assert len({p.id for p in problems}) == count
    assert all(p.question and p.answer for p in problems)


def test_suite_breakdown_and_dedup():
    problems = load_benchmark(_benchmark("suite"))
    assert Counter(p.competition for p in problems) == {
        "aime_2022": 30, "aime_2023": 30, "aime_2024": 30, "aime_2025": 30, "hmmt_feb_2025": 30,
        "brumo_2025": 30, "cmimc_2025": 40, "amc12_2022": 43, "amc12_2023": 40,
    }  # fmt: skip
    # the separately vendored AIME 2024 and AMC 2023 files are the same problems under the same ids
    by_id = {p.id: p for p in problems}
    for dup in ("aime_2024", "amc23"):
        for p in load_source(dup, DATA):
            assert by_id[p.id].question.strip() == p.question.strip() and by_id[p.id].answer == p.answer
    with pytest.raises(ValueError, match="appears in sources"):
        load_problems(["aime_2022_2024", "aime_2024"])


def test_problem_limit_and_unknown_source():
    assert [p.id for p in load_benchmark(_benchmark("suite", "benchmark.problem_limit=3"))] == [
        "aime_2022/I-01", "aime_2022/I-02", "aime_2022/I-03",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="unknown benchmark source"):
        load_problems(["nope"])


_WRITES: list[str] | None = None


def _audit(event: str, args: tuple) -> None:
    """Record every file opened for writing while ``_WRITES`` is a list (audit hooks cannot be removed)."""
    if _WRITES is not None and event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
        )
        if writing:
            _WRITES.append(str(path))


sys.addaudithook(_audit)


def test_gpqa_loads_from_zip_without_plain_text_on_disk(tmp_path):
    global _WRITES
    _WRITES = []
    (tmp_path / "control.txt").write_text("x")  # the hook sees writes
    assert [str(tmp_path / "control.txt")] == _WRITES
    _WRITES = []
    try:
        problems = load_source("gpqa_diamond", DATA, option_seed=1234)
    finally:
        writes, _WRITES = _WRITES, None
    assert len(problems) == 198
    assert writes == [], f"files opened for writing while decrypting GPQA: {writes}"
    assert not list((REPO_ROOT / "eval").rglob("*.csv"))
    # options: the four answers, shuffled per question, the same order every time, gold letter consistent
    again = load_source("gpqa_diamond", DATA, option_seed=1234)
    assert [p.choices for p in problems] == [p.choices for p in again]
    other = load_source("gpqa_diamond", DATA, option_seed=7)
    assert sum(a.choices != b.choices for a, b in zip(problems, other)) > 100
    assert Counter(p.answer for p in problems).keys() == {"A", "B", "C", "D"}
    from eval.benchmarks import read_gpqa_zip

    rows = {r["Record ID"]: r for r in read_gpqa_zip(REPO_ROOT / DATA / SOURCES["gpqa_diamond"].path)}
    for p in problems:
        assert p.choices["ABCD".index(p.answer)] == rows[p.id.split("/")[1]]["Correct Answer"].strip()



def test_a_gpqa_file_that_is_not_the_authors_zip_is_refused_naming_it(tmp_path):
    """Not a zip, a zip without the CSV and a directory were tracebacks (BadZipFile, KeyError, IsADirectoryError),
    and a CSV row with fewer columns an AttributeError ('NoneType' object has no attribute 'strip')."""
    import zipfile

    from eval.benchmarks import GPQA_MEMBER
    from zoomr.jsonl import BadRowError
    from zoomr.paths import MissingInput

    path = tmp_path / SOURCES["gpqa_diamond"].path
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a zip")
    with pytest.raises(BadRowError, match="dataset.zip: not a readable zip"):
        load_source("gpqa_diamond", tmp_path)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("other.csv", "a\n")
    with pytest.raises(BadRowError, match=f"dataset.zip: no {GPQA_MEMBER} in the zip"):
        load_source("gpqa_diamond", tmp_path)
    head = "Record ID,Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2,Incorrect Answer 3\n"
    with zipfile.ZipFile(path, "w") as z:  # plain (the reader's password is ignored for an unencrypted member)
        z.writestr(GPQA_MEMBER, head + "r1,Q?,a,b,c,d\nr2,Q?,a,b\n")
    with pytest.raises(BadRowError, match="dataset.zip row 3: 'Incorrect Answer 2' is null, not an option"):
        load_source("gpqa_diamond", tmp_path)
    path.unlink()
    path.mkdir()
    with pytest.raises(MissingInput, match="dataset.zip not found"):
        load_source("gpqa_diamond", tmp_path)


@pytest.mark.parametrize(
    "options, message",
    [
        ("a,b, ,d", "row 3: question r2: 'Incorrect Answer 2' is empty, not an option"),
        ("a,b,c,a ", "row 3: question r2: 'Incorrect Answer 3' is the correct answer again \\('a'\\)"),
        ("a,b,c,d\n ,Q?,a,b,c,d", 'row 4: Record ID is " ", not an id'),  # was the problem id gpqa_diamond/
    ],
)
def test_a_gpqa_row_that_cannot_be_asked_or_graded_is_refused_naming_it(tmp_path, options, message):
    """An empty option, or the correct answer listed again as an incorrect one, was loaded without a word: the model
    was offered a blank letter, or two right letters of which the grader accepted one. Two equal incorrect options
    stay accepted (the real file has two such questions: any of those letters is wrong). A blank Record ID was the
    problem id gpqa_diamond/."""
    import zipfile

    from eval.benchmarks import GPQA_MEMBER
    from zoomr.jsonl import BadRowError

    path = tmp_path / SOURCES["gpqa_diamond"].path
    path.parent.mkdir(parents=True)
    head = "Record ID,Question,Correct Answer,Incorrect Answer 1,Incorrect Answer 2,Incorrect Answer 3\n"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(GPQA_MEMBER, head + f"r1,Q?,a,b,b,d\nr2,Q?,{options}\n")
    with pytest.raises(BadRowError, match=message):
        load_source("gpqa_diamond", tmp_path)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(GPQA_MEMBER, head + "r1,Q?,a,b,b,d\n")
    assert sorted(load_source("gpqa_diamond", tmp_path)[0].choices) == ["a", "b", "b", "d"]


def test_prompts_use_the_chat_template(tiny_model_and_tokenizer):
    _, tokenizer = tiny_model_and_tokenizer
    math = load_source("aime_2025", DATA)[0]
    text = render(math, tokenizer)
    assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_start|>assistant\n")
    assert MATH_INSTRUCTION in text and math.question in text
    gpqa = load_source("gpqa_diamond", DATA)[0]
    msg = user_message(gpqa)
    assert "'Answer: $LETTER'" in msg and all(
        f"{letter}) {c}" in msg for letter, c in zip("ABCD", gpqa.choices)
    )
    assert render(math, tokenizer, system_prompt="Be brief.").startswith("<|im_start|>system\nBe brief.")


def test_enable_thinking_a_chat_template_never_reads_is_warned_about_before_the_run(tiny_model_and_tokenizer, caplog):
    """generation.enable_thinking=false was passed to a template that ignores it (R1-distill, Llama, the tiny models)
    without a word: the run believed reasoning off while the prompts were the same."""
    from eval.prompts import check_chat_settings
    from eval.steps import load_problems as task_problems
    from eval.tasks import get_task
    from zoomr.schemas.eval import GenerationConfig

    _, tokenizer = tiny_model_and_tokenizer
    bench = _benchmark("aime25", "benchmark.problem_limit=1")
    task_problems(get_task("math"), bench, tokenizer, GenerationConfig())
    assert "enable_thinking" not in caplog.text
    task_problems(get_task("math"), bench, tokenizer, GenerationConfig(enable_thinking=False))
    assert "generation.enable_thinking=false changes nothing: the model's chat template does not read" in caplog.text
    caplog.clear()
    tokenizer_reads = type("T", (), {"chat_template": "{% if enable_thinking is false %}<think></think>{% endif %}"})()
    check_chat_settings(tokenizer_reads, False)
    assert not caplog.text


def test_hub_source_fails_clearly_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="benchmark.source=local"):
        load_source("aime_2025", DATA, source="hub")
    with pytest.raises(ValueError, match="local\\|hub"):
        load_source("aime_2025", DATA, source="ftp")
