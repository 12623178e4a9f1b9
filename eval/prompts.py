"""Prompts: the model's own chat template around a task instruction (METHODS.md, evaluation conventions).

Math asks for the final answer in ``\\boxed{}`` (the instruction of DeepSeek-R1 / lighteval's math
tasks); GPQA lists the shuffled options and asks for a last line ``Answer: X`` (lighteval's
``gpqa:diamond`` instruct prompt). :func:`strip_reasoning` removes closed reasoning blocks before
grading when ``grading.strip_reasoning`` is set; the stored record always keeps the full text.
"""

from __future__ import annotations

import re
from typing import Any

from eval.benchmarks import LETTERS, Problem

MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
GPQA_INSTRUCTION = (
    "Answer the following multiple choice question. The last line of your response should be of the "
    "following format: 'Answer: $LETTER' (without quotes) where LETTER is one of ABCD. "
    "Think step by step before answering."
)


def user_message(problem: Problem) -> str:
    if problem.task == "math":
        return f"{problem.question}\n\n{MATH_INSTRUCTION}"
    if problem.task == "gpqa":
        options = "\n".join(f"{letter}) {choice}" for letter, choice in zip(LETTERS, problem.choices))
        return f"{GPQA_INSTRUCTION}\n\n{problem.question}\n\n{options}"
    if problem.task == "testbed":  # the synthetic task's own prompt (its model knows no instruction)
        return problem.question
    raise ValueError(f"problem {problem.id}: unknown task {problem.task!r}")


def messages(problem: Problem, system_prompt: str | None = None) -> list[dict[str, str]]:
    return chat_messages(user_message(problem), system_prompt)


def chat_messages(content: str, system_prompt: str | None = None) -> list[dict[str, str]]:
    out = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*out, {"role": "user", "content": content}]


def chat_text(
    content: str, tokenizer: Any, system_prompt: str | None = None, enable_thinking: bool | None = None
) -> str:
    """A user message through the tokenizer's chat template, with the generation prompt appended."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the tokenizer has no chat template: evaluation prompts use the model's own template"
        )
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    return tokenizer.apply_chat_template(
        chat_messages(content, system_prompt), tokenize=False, add_generation_prompt=True, **kwargs
    )


def render(
    problem: Problem, tokenizer: Any, system_prompt: str | None = None, enable_thinking: bool | None = None
) -> str:
    """The prompt text: the tokenizer's chat template with the generation prompt appended."""
    return chat_text(user_message(problem), tokenizer, system_prompt, enable_thinking)


# A closed reasoning block: R1/Qwen3 <think>…</think> (the opening tag may sit in the prompt) or the
# Bespoke-Stratos / Sky-T1 <|begin_of_thought|>…<|end_of_thought|>.
_CLOSERS = ("</think>", "<|end_of_thought|>")


def strip_reasoning(text: str) -> str:
    """Text after the last closed reasoning block; unchanged when no block was closed (truncated)."""
    cut = max((text.rfind(c) + len(c) for c in _CLOSERS if c in text), default=0)
    out = text[cut:]
    return (
        re.sub(r"^\s*<\|begin_of_solution\|>|<\|end_of_solution\|>\s*$", "", out.strip()).strip()
        if cut
        else text
    )
