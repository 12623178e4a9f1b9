"""The math and GPQA tasks of the evaluator (METHODS.md, evaluation conventions; :mod:`eval.tasks`).

Math asks for the final answer in ``\\boxed{}`` (the instruction of DeepSeek-R1 / lighteval's math
tasks) and is graded by the shared grader's math stages (exact ``\\boxed{}`` match, then math-verify).
GPQA lists the shuffled options and asks for a last line ``Answer: X`` (lighteval's ``gpqa:diamond``
instruct prompt), graded by the chosen letter (:func:`eval.grading.grade_letter`).
"""

from __future__ import annotations

from eval.benchmarks import LETTERS, Problem
from eval.grading import grade_letter
from eval.tasks import Task

MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
GPQA_INSTRUCTION = (
    "Answer the following multiple choice question. The last line of your response should be of the "
    "following format: 'Answer: $LETTER' (without quotes) where LETTER is one of ABCD. "
    "Think step by step before answering."
)


class MathTask(Task):
    """Competition math (AIME, HMMT, MATH-500, …): graded by the grader's math stages."""

    name = "math"

    def user_message(self, problem: Problem) -> str:
        return f"{problem.question}\n\n{MATH_INSTRUCTION}"


class GpqaTask(Task):
    """GPQA-Diamond: four shuffled options, graded by the letter of the last ``Answer: X`` line."""

    name = "gpqa"
    answer_check = staticmethod(grade_letter)

    def user_message(self, problem: Problem) -> str:
        options = "\n".join(f"{letter}) {choice}" for letter, choice in zip(LETTERS, problem.choices))
        return f"{GPQA_INSTRUCTION}\n\n{problem.question}\n\n{options}"


MATH, GPQA = MathTask(), GpqaTask()

