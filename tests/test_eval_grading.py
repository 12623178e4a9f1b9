"""Grader: reference solutions pass, gold answers match themselves and not perturbations, pathological
answers and stuck workers cannot hang a run, GPQA letters come from anchored patterns."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from eval.benchmarks import load_problems, load_source
from eval.grading import Grader, exact_match, extract_letter, grade_letter, last_boxed, normalize
from eval.prompts import strip_reasoning

COMPETITIONS = ["aime_2022_2024", "aime_2024", "aime_2025", "hmmt_feb_2025", "brumo_2025", "cmimc_2025"]


@pytest.fixture(scope="module")
def grader():
    with Grader(workers=2, timeout_s=10) as g:
        yield g


@pytest.fixture(scope="module")
def mv_grader():
    """Every math sample through math-verify (the exact stage off), to test that stage itself."""
    with Grader(workers=2, timeout_s=10, exact_first=False) as g:
        yield g


def test_math500_reference_solutions_are_correct(grader, mv_grader):
    problems = load_source("math500", "eval/data/benchmarks")
    samples = [(p.meta["solution"], p.answer) for p in problems]
    for g in (grader, mv_grader):
        grades = g.grade(samples)
        assert sum(x.correct for x in grades) >= 0.99 * len(problems)
    assert {x.method for x in mv_grader.grade(samples[:20])} <= {"math_verify", "none"}


def _perturb(answer: str) -> str:
    return str(int(answer) + 1) if re.fullmatch(r"-?\d+", answer) else f"{answer}+1"


def test_competition_golds_match_themselves_not_perturbations(mv_grader, grader):
    problems = load_problems(COMPETITIONS[:1] + COMPETITIONS[2:] + ["amc12_2022_2023"])
    load_problems(["aime_2024"])  # the duplicate set loads on its own
    good = [(f"So the answer is $\\boxed{{{p.answer}}}$.", p.answer) for p in problems]
    bad = [(f"So the answer is $\\boxed{{{_perturb(p.answer)}}}$.", p.answer) for p in problems]
    for g in (grader, mv_grader):
        assert all(x.correct for x in g.grade(good))
        wrong = [p.id for p, x in zip(problems, g.grade(bad)) if x.correct]
        assert not wrong, wrong


def test_math_verify_judges_equivalent_forms(grader):
    cases = [
        ("Thus $x = \\boxed{0.5}$", "\\frac{1}{2}", True),
        ("the answer is \\boxed{\\dfrac{\\sqrt{3}}{3}}", "\\frac{1}{\\sqrt{3}}", True),
        ("\\boxed{(3, \\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
        ("\\boxed{7}", "\\frac{1}{2}", False),
        ("no answer at all", "12", False),
    ]
    grades = grader.grade([(t, g) for t, g, _ in cases])
    assert [x.correct for x in grades] == [ok for *_, ok in cases]


def test_pathological_200kb_nested_boxed_returns_within_timeout():
    depth = 200_000 // 10  # "\\frac{" + "}{2}" = 10 characters per level
    text = "\\boxed{" + "\\frac{" * depth + "1" + "}{2}" * depth + "}"
    assert len(text) >= 190_000
    t0 = time.monotonic()
    with Grader(workers=1, timeout_s=3) as g:
        (grade,) = g.grade([(text, "\\frac{1}{2}")])
    assert time.monotonic() - t0 < 3 + 5  # the timeout plus worker start/kill slack
    assert grade.correct is False


def _stuck(text: str, gold: str, inner_timeout: int):
    """A check that ignores math-verify's alarm, like a hang inside C code."""
    if text == "hang":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(600)
    if text == "crash":
        os._exit(3)
    return text, text == gold


def test_stuck_and_dead_workers_are_replaced():
    samples = [("hang", "1"), ("1", "1"), ("crash", "1"), ("1", "1")]
    t0 = time.monotonic()
    with Grader(workers=1, timeout_s=1.5, exact_first=False, check=_stuck) as g:
        grades = g.grade(samples)
        assert g.timeouts == 1 and g.restarts == 2
        os.kill(g._workers[0].proc.pid, signal.SIGKILL)  # an idle worker killed from outside
        g._workers[0].proc.join(5)
        assert [x.correct for x in g.grade([("2", "2")])] == [True] and g.restarts == 3
    assert time.monotonic() - t0 < 20
    assert [x.method for x in grades] == ["timeout", "math_verify", "error", "math_verify"]
    assert [x.correct for x in grades] == [False, True, False, True]


def test_last_boxed_and_normalize():
    assert last_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}} c") == "\\frac{1}{2}"
    assert last_boxed("\\fbox{x^{2}}") == "x^{2}"
    assert last_boxed("\\boxed 5$") == "5"
    assert last_boxed("\\boxed{\\{1,2\\}}") == "\\{1,2\\}"
    assert last_boxed("\\boxed{unclosed {") is None
    assert last_boxed("nothing") is None
    assert normalize("023") == "23" and normalize("1,000") == "1000" and normalize("1,2") == "1,2"
    assert normalize("\\dfrac{1}{2}.") == normalize("\\frac{1}{2}")
    assert normalize("90^\\circ") == "90" and normalize("\\text{Evelyn}") == "Evelyn"
    assert exact_match("so \\boxed{ 042 }", "42") == (" 042 ", True)


def test_gpqa_letter_extraction_is_anchored():
    assert extract_letter("Reasoning...\nAnswer: C") == "C"
    assert extract_letter("**Answer:** (b)\n") == "B"
    assert extract_letter("Answer: A\nWait, let me redo this.\nAnswer: D") == "D"
    # a mid-sentence "answer: X" is not an answer line; the anchored line wins
    assert extract_letter("Answer: B\nso the answer: A could also be argued") == "B"
    assert extract_letter("the final choice is $\\boxed{D}$") == "D"
    assert extract_letter("I think the answer is (C).") == "C"
    assert extract_letter("No letter here. Answer: maybe") is None
    with Grader(workers=1) as g:
        grades = g.grade([("Answer: C", "C", grade_letter), ("Answer: A", "C", grade_letter), ("hmm", "C", grade_letter)])
    assert [x.correct for x in grades] == [True, False, False]
    assert [x.method for x in grades] == ["letter", "letter", "none"]


def test_strip_reasoning():
    assert strip_reasoning("<think>\\boxed{1}</think>The answer is \\boxed{2}") == "The answer is \\boxed{2}"
    text = (
        "<|begin_of_thought|>\\boxed{1}<|end_of_thought|>\n<|begin_of_solution|>\\boxed{2}<|end_of_solution|>"
    )
    assert strip_reasoning(text) == "\\boxed{2}"
    assert strip_reasoning("<think>unfinished \\boxed{1}") == "<think>unfinished \\boxed{1}"
    with Grader(workers=1, strip_reasoning=True, math_verify=False) as g:
        (grade,) = g.grade([("<think>\\boxed{2}</think> final \\boxed{1}", "2")])
    assert not grade.correct and grade.extracted == "1"
