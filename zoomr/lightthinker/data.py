"""Examples for the LightThinker trainer: dataset rows → segmented responses → streams.

Accepts any ``data.loader``'s dataset with chat ``messages`` or ``prompt`` / ``completion`` columns (as
:mod:`zoomr.abridge.data`): real traces are cut into the paragraphs inside their thought tags, testbed
responses (no tags) into their paragraphs (:func:`zoomr.lightthinker.layout.segment_response`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from zoomr.abridge.data import StreamSet, collect_streams, prompt_response_text
from zoomr.abridge.layout import PROMPT, RAW, Stream
from zoomr.lightthinker.layout import CONTINUE, ThoughtTokens, interleave, response_ids, segment_response


@dataclass
class ThoughtStats:
    """How the streams were segmented: thoughts compressed, raw response tokens, cache + continue tokens,
    over ``streams`` streams (all of a materialised set, the first :data:`SAMPLE` of a lazily built one)."""

    thoughts: int
    raw_tokens: int
    forced_tokens: int
    streams: int = 0
    sampled: bool = False

    @classmethod
    def of(cls, streams: Sequence[Stream]) -> ThoughtStats:
        sampled = not isinstance(streams, list) and len(streams) > SAMPLE
        seen = list(streams[:SAMPLE] if sampled else streams)
        thoughts = sum(s.kind.count(CONTINUE) for s in seen)
        raw = sum(s.kind.count(RAW) for s in seen)
        forced = sum(len(s) - s.kind.count(RAW) - s.kind.count(PROMPT) for s in seen)
        return cls(thoughts, raw, forced, len(seen), sampled)

    def describe(self) -> str:
        per = self.thoughts / max(1, self.streams)
        mean_len = self.raw_tokens / max(1, self.thoughts + self.streams)
        where = f" in the first {self.streams} streams" if self.sampled else ""
        return f"{self.thoughts} thoughts{where} ({per:.1f} per response, ~{mean_len:.0f} raw tokens per segment)"


SAMPLE = 16  # streams of a lazily built set that the statistics read (each one is generated on access)


def build_streams(
    examples: Iterable[dict[str, Any]],
    tokenizer,
    tt: ThoughtTokens,
    max_prompt_tokens: int,
    max_response_tokens: int,
    min_thought_chars: int = 0,
) -> StreamSet:
    """Segment, tokenise (a splitter after every thought), truncate, skip over-long prompts and responses
    without a thought (counted as ``no_thoughts``), interleave."""

    def pairs():
        for ex in examples:
            prompt_text, response_text = prompt_response_text(ex, tokenizer)
            prompt = list(tokenizer(prompt_text, add_special_tokens=False)["input_ids"])
            thoughts, tail = segment_response(response_text, min_thought_chars)
            yield prompt, response_ids(thoughts, tail, tokenizer, tt.splitter) if thoughts else []

    return collect_streams(
        pairs(),
        lambda prompt, response: interleave(prompt, response, tt),
        max_prompt_tokens,
        max_response_tokens,
        empty_reason="no_thoughts",
    )
