"""RULER generated offline (eval/ruler.py): gold answers score 1.0 and perturbed ones less, prompts land
within 2% of the target length in the model's own tokens, generation is deterministic, and the tasks are
well formed (needles, chains and frequencies are really in the prompt)."""

from __future__ import annotations

import re
from collections import Counter
from types import SimpleNamespace

import pytest

from eval import ruler
from tests.conftest import tiny_spec

GEN = SimpleNamespace(system_prompt=None, enable_thinking=None)


@pytest.fixture(scope="module")
def tokenizer(cache_dir):
    from zoomr.models import load_tokenizer

    return load_tokenizer(tiny_spec("qwen2"), cache_dir)


def bench(length: int, limit: int, sources=ruler.SYNTHETIC, **options) -> SimpleNamespace:
    return SimpleNamespace(length=length, sources=list(sources), options=options, problem_limit=limit)


@pytest.fixture(scope="module")
def problems_1k(tokenizer):
    return ruler.load(bench(1024, 3), tokenizer, GEN)


@pytest.fixture(scope="module")
def problems_4k(tokenizer):
    return ruler.load(bench(4096, 2), tokenizer, GEN)


def _tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False).input_ids)


def _perturb(answers: list[str]) -> list[str]:
    """The gold answers with the first one replaced by a string of the same shape that is not in the gold."""
    first = answers[0]
    wrong = re.sub(r"\d", lambda m: str((int(m.group()) + 1) % 10), first)
    if wrong == first:
        wrong = "".join(chr((ord(c.lower()) - 96) % 26 + 97) if c.isalpha() else c for c in first)
    return [wrong, *answers[1:]]


@pytest.mark.parametrize("which", ["problems_1k", "problems_4k"])
def test_every_gold_scores_one_and_a_perturbed_answer_scores_less(which, request):
    problems = request.getfixturevalue(which)
    assert {p.competition for p in problems} == set(ruler.SYNTHETIC)
    for p in problems:
        answers = p.meta["answers"]
        assert ruler._score_problem(p, " " + ", ".join(answers) + ".") == 1.0, p.id
        perturbed = _perturb(answers)
        assert perturbed[0] not in answers
        assert ruler._score_problem(p, ", ".join(perturbed)) < 1.0, p.id
        assert ruler._score_problem(p, "I do not know.") == 0.0, p.id


@pytest.mark.parametrize("which, length", [("problems_1k", 1024), ("problems_4k", 4096)])
def test_prompt_lengths_are_within_two_percent_of_the_target(which, length, tokenizer, request):
    for p in request.getfixturevalue(which):
        target = length - ruler.SUBSETS[p.competition].tokens_to_generate  # RULER: prompt + generation
        assert p.meta["target_tokens"] == target
        n = _tokens(tokenizer, p.meta["prompt"])  # counted again, independently of the generator
        assert n == p.meta["prompt_tokens"]
        assert n <= target, p.id
        if length == 4096 or ruler.SUBSETS[p.competition].args.get("haystack") != "needle":
            assert n >= 0.98 * target, (p.id, n, target)  # (a distractor needle is > 2% of 1K tokens)


def test_generation_is_deterministic_and_seeded(tokenizer):
    a = ruler.load(bench(1024, 2), tokenizer, GEN)
    b = ruler.load(bench(1024, 2, sources=list(reversed(ruler.SYNTHETIC))), tokenizer, GEN)
    by_id = {p.id: p.meta["prompt"] for p in b}
    assert [p.meta["prompt"] for p in a] == [by_id[p.id] for p in a]  # same examples in any order
    one = ruler.load(bench(1024, 1), tokenizer, GEN)  # problem_limit takes a prefix of each subset
    assert all(p.meta["prompt"] == by_id[p.id] for p in one)
    other = ruler.load(bench(1024, 1, seed=7), tokenizer, GEN)
    assert sum(p.meta["prompt"] != by_id[p.id] for p in other) >= len(other) - 1
    assert len({p.meta["prompt"] for p in a if p.competition == "niah_single_1"}) == 2


def test_tasks_are_well_formed(problems_4k):
    for p in problems_4k:
        text, answers, sub = p.meta["prompt"], p.meta["answers"], p.competition
        if sub.startswith("niah"):
            spec = ruler.SUBSETS[sub].args
            assert len(answers) == spec["v"] * spec["q"]
            for value in answers:
                assert text.count(f"is: {value}.") == 1
            assert "mentioned in the provided text are" in text[-200:]  # the answer prefix opens the reply
            if spec["haystack"] == "repeat":
                assert text.count("The grass is green.") > 50
            if spec["haystack"] == "needle":
                assert text.count("One of the special magic") > 20
        elif sub == "vt":
            assert len(answers) == 5
            value = re.search(r"VAR " + answers[0] + r" = (\d+)", text).group(1)
            for a, b in zip(answers, answers[1:]):
                assert f"VAR {b} = VAR {a}" in text
            assert f"assgined the value {value}, they are:" in text[-200:]
        elif sub == "cwe":
            main = text[text.rindex("Below is a numbered list") :]
            counts = Counter(re.findall(r"\d+\. ([a-z]+)", main))
            assert len(answers) == 10
            assert {counts[w] for w in answers} == {30} and max(
                c for w, c in counts.items() if w not in answers
            ) == 3
        elif sub == "fwe":
            body = text[text.index("coded words. ") : text.index("\nQuestion:")]
            counts = Counter(w for w in body.split() if w.isalpha() and len(w) == 6)
            assert [w for w, _ in counts.most_common(3)] == answers


def test_largest_fitting_finds_the_exact_bound_from_any_guess():
    def tokens_of(n: int) -> int:
        return 10 + 3 * n

    for guess in (1, 5, 300, 10_000):
        assert ruler.largest_fitting(tokens_of, 1000, 5000, guess) == 330
    assert ruler.largest_fitting(tokens_of, 1000, 100, 7) == 100  # the haystack's end
    with pytest.raises(ValueError, match="template alone"):
        ruler.largest_fitting(tokens_of, 5, 100, 1)


def test_bad_settings_fail_with_a_clear_message(tokenizer):
    with pytest.raises(ValueError, match="unknown RULER subsets"):
        ruler.settings_of(bench(4096, 1, sources=["niah_single_9"]))
    with pytest.raises(ValueError, match="benchmark.options for RULER"):
        ruler.settings_of(bench(4096, 1, colour="red"))
    with pytest.raises(ValueError, match="RULER's subsets is benchmark.sources"):  # was "got multiple values for …"
        ruler.settings_of(bench(4096, 1, subsets=["vt"]))
    with pytest.raises(ValueError, match="cwe at benchmark.length=512"):
        ruler.load(bench(512, 1, sources=["cwe"]), tokenizer, GEN)
    with pytest.raises(ValueError, match=r"benchmark.options.seed=1.5 \(must be an int\)"):  # was a stream of its own
        ruler.settings_of(bench(4096, 1, seed=1.5))
    with pytest.raises(ValueError, match=r"benchmark.options.qa='no' \(must be a bool\)"):  # a string is true
        ruler.settings_of(bench(4096, 1, qa="no"))
    with pytest.raises(ValueError, match="benchmark.length must be >= 256 tokens, got 0"):  # was run at 4096 as ruler_0
        ruler.settings_of(bench(0, 1))
    assert ruler.settings_of(bench(None, 1)).length == 4096


def test_qa_subsets_fail_fast_offline(tokenizer, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ruler.qa_rows.cache_clear()
    with pytest.raises(RuntimeError, match=r"options.qa=false"):
        ruler.load(bench(4096, 1, sources=["niah_single_1"], qa=True), tokenizer, GEN)


def test_string_match_scores():
    assert ruler.string_match_all("The numbers are 12 and 34.", ["12", "34", "56"]) == pytest.approx(2 / 3)
    assert ruler.string_match_all("ABC-def", ["abc-DEF"]) == 1.0
    assert ruler.string_match_part("It is Paris.", ["London", "paris"]) == 1.0
    assert ruler.string_match_part("It is Rome.", ["London", "paris"]) == 0.0


def test_an_unusable_haystack_is_refused_naming_the_file(tokenizer, tmp_path):
    """A haystack with too few words was random's "Sample larger than population" (NIAH, naming no file) and, with
    two words, NIAH multikey's draw of 4 distinct keys never ended; a directory was an IsADirectoryError traceback
    and a file that is not UTF-8 the codec's message, naming neither."""
    from zoomr.jsonl import BadRowError
    from zoomr.paths import MissingInput

    two = tmp_path / "two.txt"
    two.write_text("alpha beta. " * 3 + "Some text. " * 50)  # two key words: 'alpha', 'some'
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe text")
    for sources, haystack, error, message in [
        (["niah_multikey_1"], two, ValueError, f"the haystack text {two} gives 2 distinct words .* RULER niah draws from 3"),
        (["niah_single_2"], tmp_path / "short.txt", ValueError, "gives 0 distinct words"),
        (["cwe"], two, ValueError, "RULER cwe draws from 31"),
        (["niah_single_2"], tmp_path, MissingInput, "RULER haystack text .* not found"),
        (["niah_single_2"], binary, BadRowError, r"binary.txt is not UTF-8 text \(byte 0"),
    ]:
        (tmp_path / "short.txt").write_text("")
        with pytest.raises(error, match=message):
            ruler.load(bench(1024, 1, sources=sources, haystack=str(haystack)), tokenizer, GEN)
