"""The KVzip repeat pretext (KVzap paper §3.1; KVzip, Kim et al. 2025).

``user: <ctx>\\n\\nRepeat the previous context exactly. assistant: <ctx>`` rendered with the model's
chat template. The template is rendered around a sentinel and the context's token ids are spliced
in, so both copies of the context are the SAME ids and their spans are exact (kvpress's collector
re-tokenises the whole string and locates the spans by character offsets instead; the two differ
at most by a merge at a copy's boundary).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

REPEAT_INSTRUCTION = "\n\nRepeat the previous context exactly."
_SENTINEL = "\x00KVZIP_CONTEXT\x00"


@dataclass(frozen=True)
class RepeatPretext:
    """Token ids of the extended prompt and the half-open spans of the context and of its repeat."""

    input_ids: torch.Tensor  # (1, T) long
    context: tuple[int, int]  # [start, end) of the original context
    repeat: tuple[int, int]  # [start, end) of the repeated context (the scoring queries)

    @property
    def n_context(self) -> int:
        return self.context[1] - self.context[0]

    def __post_init__(self) -> None:
        (cs, ce), (rs, re_) = self.context, self.repeat
        if not (0 <= cs < ce <= rs < re_ <= self.input_ids.shape[-1]):
            raise ValueError(
                f"bad pretext spans: context {self.context}, repeat {self.repeat}, T={self.input_ids.shape[-1]}"
            )


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def build_repeat_pretext(
    tokenizer, context_ids: Sequence[int] | torch.Tensor, instruction: str = REPEAT_INSTRUCTION
) -> RepeatPretext:
    """Render ``[user: ctx + instruction, assistant: ctx]`` with the chat template, splicing ``context_ids``.

    Without a chat template the layout is ``ctx instruction \\n ctx`` (kvpress's fallback suffix).
    """
    ctx = [int(t) for t in (context_ids.tolist() if torch.is_tensor(context_ids) else context_ids)]
    if not ctx:
        raise ValueError("empty context")
    if getattr(tokenizer, "chat_template", None):
        messages = [
            {"role": "user", "content": _SENTINEL + instruction},
            {"role": "assistant", "content": _SENTINEL},
        ]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        parts = text.split(_SENTINEL)
        if len(parts) != 3:
            raise ValueError(f"chat template rendered the context {len(parts) - 1} times, expected 2")
        prefix, middle, _ = parts
    else:
        prefix, middle = "", instruction + "\n"
    pre, mid = _encode(tokenizer, prefix), _encode(tokenizer, middle)
    ids = pre + ctx + mid + ctx
    cs = len(pre)
    rs = cs + len(ctx) + len(mid)
    return RepeatPretext(torch.tensor([ids]), (cs, cs + len(ctx)), (rs, rs + len(ctx)))
