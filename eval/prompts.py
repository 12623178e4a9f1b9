"""Prompts: the model's own chat template around a task's user message (METHODS.md, evaluation conventions).

Each task writes its user message (:mod:`eval.tasks`; math and GPQA instructions in
:mod:`eval.math_tasks`); :func:`chat_text` puts it through the tokenizer's chat template.
:func:`strip_reasoning` removes closed reasoning blocks before grading when ``grading.strip_reasoning``
is set; the stored record always keeps the full text.
"""

from __future__ import annotations

import logging
import re
from typing import Any

log = logging.getLogger(__name__)


class SpecialTokenInText(ValueError):
    """A prompt's text holds a string the tokenizer reads as a special token (e.g. a problem quoting ``<|im_end|>``)."""


def check_plain_text(text: str | None, tokenizer: Any, what: str) -> None:
    """Refuse (:class:`SpecialTokenInText`) ``text`` holding a string ``tokenizer`` reads as one special token
    (:func:`zoomr.tokens.read_as_special`): it was tokenized as that token, not as its characters, so a problem
    quoting ``<|im_end|>`` ended the user turn early and one quoting ``<|pause_3|>`` wrote a pause token."""
    from zoomr.tokens import describe_specials, read_as_special, specials_in

    if text and (found := specials_in(text, read_as_special(tokenizer))):
        raise SpecialTokenInText(
            f"{what} holds {describe_specials(found)} literally, which the model's tokenizer reads as its special "
            "token(s), not as text (the prompt would not say what the text says)"
        )


def chat_messages(content: str, system_prompt: str | None = None) -> list[dict[str, str]]:
    out = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return [*out, {"role": "user", "content": content}]


def chat_text(
    content: str, tokenizer: Any, system_prompt: str | None = None, enable_thinking: bool | None = None
) -> str:
    """A user message through the tokenizer's chat template, with the generation prompt appended; a message or
    system prompt holding a special token's string is refused (:func:`check_plain_text`)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the tokenizer has no chat template: evaluation prompts use the model's own template"
        )
    check_plain_text(system_prompt, tokenizer, "generation.system_prompt")
    check_plain_text(content, tokenizer, "the user message")
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    return tokenizer.apply_chat_template(
        chat_messages(content, system_prompt), tokenize=False, add_generation_prompt=True, **kwargs
    )


def check_chat_settings(tokenizer: Any, enable_thinking: bool | None) -> None:
    """Warn, before a run, when ``generation.enable_thinking`` is set and the tokenizer's chat template never reads it
    (only Qwen3-style templates do): the prompts are the same either way, so an R1-distill or Llama model reasons, or
    not, as it always does. It was passed to the template without a word. A warning, not a refusal: arms of several
    models keep the same settings for ``eval.compare``."""
    template = getattr(tokenizer, "chat_template", None)
    texts = list(template.values()) if isinstance(template, dict) else [template]
    if enable_thinking is not None and template and not any("enable_thinking" in str(t) for t in texts):
        log.warning("generation.enable_thinking=%s changes nothing: the model's chat template does not read "
                    "enable_thinking (its prompts are the same either way)", str(enable_thinking).lower())  # fmt: skip


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
