"""Examples for the block-masked trainer: prompt/response token ids → interleaved streams → padded batches.

Accepts any ``data.loader``'s dataset with either chat ``messages`` (the last message is the assistant
response; everything before it, rendered with the chat template and the generation prompt, is the
prompt) or ``prompt`` / ``completion`` text columns.
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from zoomr.abridge.layout import IGNORE, PAD, AbridgeLayout, Stream, interleave, pause_token_ids
from zoomr.abridge.mask import TokenMeta
from zoomr.schemas.checks import SettingsError
from zoomr.tokens import IM_END


def prompt_response_ids(example: dict[str, Any], tokenizer) -> tuple[list[int], list[int]]:
    """Token ids of the prompt (chat template + generation prompt) and of the response (+ end of turn)."""
    prompt, response = prompt_response_text(example, tokenizer)
    enc = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return list(enc), list(tokenizer(response, add_special_tokens=False)["input_ids"])


def prompt_response_text(example: dict[str, Any], tokenizer) -> tuple[str, str]:
    """The prompt text (chat template + generation prompt) and the response text (+ end of turn)."""
    if "messages" in example:
        msgs = example["messages"]
        if not msgs or msgs[-1]["role"] != "assistant":
            raise ValueError("chat example must end with an assistant message")
        if not getattr(tokenizer, "chat_template", None):  # was transformers' ValueError traceback
            raise SettingsError(
                f"the tokenizer of the model ({getattr(tokenizer, 'name_or_path', '?')}) has no chat template, and the "
                "data's rows are chat messages whose prompt is rendered with it; train a model whose tokenizer has "
                "one, or give data with prompt and completion columns"
            )
        prompt = tokenizer.apply_chat_template(msgs[:-1], add_generation_prompt=True, tokenize=False)
        response = msgs[-1]["content"] + IM_END
    elif "prompt" in example and "completion" in example:
        prompt, response = example["prompt"], example["completion"]
    else:
        raise ValueError(f"example needs 'messages' or 'prompt'+'completion', has {sorted(example)}")
    return prompt, response


@dataclass
class StreamSet:
    """Streams built from a dataset plus what was dropped and why."""

    streams: list[Stream]
    skipped: Counter = field(default_factory=Counter)
    truncated: int = 0

    def describe(self) -> str:
        skip = ", ".join(f"{k}: {v}" for k, v in sorted(self.skipped.items())) or "none"
        return f"{len(self.streams)} streams ({self.truncated} responses truncated; skipped {skip})"


def build_streams(
    examples: Iterable[dict[str, Any]],
    tokenizer,
    layout: AbridgeLayout,
    max_prompt_tokens: int,
    max_response_tokens: int,
) -> StreamSet:
    """Tokenise, truncate responses to ``max_response_tokens``, skip over-long prompts, interleave."""
    pauses = pause_token_ids(tokenizer, layout.num_pause)
    return collect_streams(
        (prompt_response_ids(ex, tokenizer) for ex in examples),
        lambda prompt, response: interleave(prompt, response, layout, pauses),
        max_prompt_tokens,
        max_response_tokens,
    )


def collect_streams(
    pairs: Iterable[tuple[list[int], list[int]]],
    make_stream: Callable[[list[int], list[int]], Stream],
    max_prompt_tokens: int,
    max_response_tokens: int,
    empty_reason: str = "empty_response",
) -> StreamSet:
    """(prompt ids, response ids) pairs → streams: over-long prompts and empty responses are skipped and
    counted (``empty_reason``), responses truncated to ``max_response_tokens``."""
    out = StreamSet([])
    for prompt, response in pairs:
        if len(prompt) > max_prompt_tokens:
            out.skipped["prompt_too_long"] += 1
            continue
        if not response:
            out.skipped[empty_reason] += 1
            continue
        if len(response) > max_response_tokens:
            response = response[:max_response_tokens]
            out.truncated += 1
        out.streams.append(make_stream(prompt, response))
    return out


class LazyStreams:
    """Streams built on access from ``examples[i] = (prompt ids, response ids, loss positions)`` (a data
    loader's ``token_examples``): a long generated training stream is never materialised. Indexing with a
    slice gives a view; responses are truncated to ``max_response_tokens`` (their loss positions with them).
    ``make_stream(prompt, response, loss_positions)`` lays one example out (AbridgeKV's blocks and pauses,
    LightThinker's thoughts and cache tokens)."""

    def __init__(self, examples, make_stream: Callable[[list[int], list[int], list[int]], Stream],
                 max_prompt_tokens: int, max_response_tokens: int, index: range | None = None) -> None:
        self.examples, self.make_stream = examples, make_stream
        self.max_prompt, self.max_response = max_prompt_tokens, max_response_tokens
        self.index = range(len(examples)) if index is None else index

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return LazyStreams(self.examples, self.make_stream, self.max_prompt, self.max_response, self.index[i])
        prompt, response, loss = self.example(i)
        return self.make_stream(prompt, response, loss)

    def example(self, i: int) -> tuple[list[int], list[int], list[int]]:
        """Example ``i`` of this view, checked and truncated: (prompt ids, response ids, loss positions)."""
        prompt, response, loss = self.examples[self.index[i]]
        if len(prompt) > self.max_prompt:
            raise ValueError(f"example {self.index[i]}: prompt of {len(prompt)} tokens > max_prompt_tokens="
                             f"{self.max_prompt}")
        response = response[: self.max_response]
        return prompt, response, [j for j in loss if j < len(response)]

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def lazy_streams(
    data: dict[str, Any], tokenizer, make_stream, max_prompt: int, max_response: int
) -> LazyStreams | None:
    """The ``token_examples`` of the data's loader as :class:`LazyStreams`, or None when the loader has none.
    Raises when the first examples' responses exceed ``max_response`` (truncation would cut the answers)."""
    loader = importlib.import_module(data["loader"]) if data.get("loader") else None
    if not hasattr(loader, "token_examples"):
        return None
    examples = loader.token_examples(data, tokenizer)
    longest = max(len(examples[i][1]) for i in range(min(len(examples), 16)))
    if longest > max_response:
        raise SettingsError(
            f"data {data.get('name')!r}: responses of up to {longest} tokens, max_response_tokens="
            f"{max_response} would cut them; raise method.max_response_tokens"
        )
    return LazyStreams(examples, make_stream, max_prompt, max_response)


def collate(streams: Sequence[Stream], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest stream: ``input_ids, position_ids, labels, kind, block, slot``."""
    length = max(len(s) for s in streams)

    def pad(rows: list[list[int]], value: int) -> torch.Tensor:
        return torch.tensor([r + [value] * (length - len(r)) for r in rows], dtype=torch.long)

    return {
        "input_ids": pad([s.input_ids for s in streams], pad_id),
        "position_ids": pad([s.position_ids for s in streams], 0),
        "labels": pad([s.labels for s in streams], IGNORE),
        "kind": pad([s.kind for s in streams], PAD),
        "block": pad([s.block for s in streams], -1),
        "slot": pad([s.slot for s in streams], -1),
    }


def batch_meta(batch: dict[str, torch.Tensor]) -> TokenMeta:
    return TokenMeta(batch["kind"], batch["block"], batch["slot"])
