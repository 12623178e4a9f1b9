"""Segments of a reasoning trace: thoughts, paragraphs, summaries, semantic boundaries (ZoomR §3.2-3.4, A.3).

Text level (data preparation, ZoomR §3.2):
  :func:`split_thought` finds the text between the thought tags, :func:`split_paragraphs` cuts it at
  blank lines (merging paragraphs shorter than ``min_chars`` into the next one: the paper's memory
  example assumes ~250-token regular segments, and real traces have many one-line "paragraphs"), and
  :func:`insert_summaries` writes ``paragraph\\n\\n<|begin_of_summary|>summary<|end_of_summary|>`` back.

Token level (decoding, ZoomR §3.3):
  :class:`SegmentTracker` reads generated token ids one at a time and maintains the regular segments
  R_i (token positions of paragraph i: everything generated since the previous summary closed, up to
  its ``<|begin_of_summary|>``) and the summary segments S_i (``<|begin_of_summary|>`` … ``<|end_of_summary|>``,
  both delimiters included, so a kept summary is a well-formed block for the model). Positions are
  absolute (logical) token positions, half-open ``[start, end)``.

Semantic boundaries (ZoomR A.3): a token whose decoded piece ends with ``.``, ``!``, ``?``, ``...`` or ``:``
(ignoring trailing spaces) or contains a blank line (``\\n\\n``, ``\\n\\n\\n``). Detected per token piece,
as the paper's preset token list is; :func:`boundary_table` precomputes the flag for a whole vocabulary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from zoomr import tokens

# ---------------------------------------------------------------- text level

THOUGHT_TAGS = ((tokens.BEGIN_THOUGHT, tokens.END_THOUGHT), (tokens.THINK, tokens.END_THINK))
_BLANK_LINE = re.compile(r"\r?\n[ \t\r]*\n\s*")  # CRLF (Windows) line ends too: "\r\n\r\n" was no blank line


@dataclass
class ThoughtSplit:
    """``response == prefix + thought + suffix``; ``prefix`` ends with the opening tag (and its blank lines)."""

    prefix: str
    thought: str
    suffix: str
    closed: bool  # False: the closing tag is missing (a truncated generation)


def split_thought(response: str) -> ThoughtSplit | None:
    """Locate the thought section (``<|begin_of_thought|>`` or ``<think>``); None when there is none."""
    for begin, end in THOUGHT_TAGS:
        start = response.find(begin)
        if start < 0:
            continue
        body_start = start + len(begin)
        lead = re.match(r"\s*", response[body_start:])
        body_start += lead.end() if lead else 0
        stop = response.find(end, body_start)
        closed = stop >= 0
        if not closed:
            stop = len(response)
        # trailing whitespace before the closing tag belongs to the suffix
        body_end = body_start + len(response[body_start:stop].rstrip())
        return ThoughtSplit(response[:body_start], response[body_start:body_end], response[body_end:], closed)
    return None


@dataclass
class Paragraph:
    text: str  # the paragraph, without the blank line that follows it
    sep: str  # the blank line(s) after it ("" for the last one)


def split_paragraphs(thought: str, min_chars: int = 0) -> list[Paragraph]:
    """Blank-line separated paragraphs; ``"".join(p.text + p.sep) == thought`` for any non-blank thought.

    Paragraphs shorter than ``min_chars`` are merged with the following ones (keeping their blank
    lines inside the merged text); a short tail is merged into the previous paragraph.
    """
    if not thought.strip():
        return []
    pieces: list[Paragraph] = []
    pos = 0
    # leading whitespace stays in the first paragraph; the regex swallows runs of blank lines whole
    for m in _BLANK_LINE.finditer(thought, len(thought) - len(thought.lstrip())):
        pieces.append(Paragraph(thought[pos : m.start()], m.group()))
        pos = m.end()
    if pos < len(thought):
        pieces.append(Paragraph(thought[pos:], ""))
    if min_chars <= 0 or len(pieces) <= 1:
        return pieces
    merged: list[Paragraph] = []
    current: Paragraph | None = None
    for p in pieces:
        if current is None:
            current = Paragraph(p.text, p.sep)
        else:
            current = Paragraph(current.text + current.sep + p.text, p.sep)
        if len(current.text) >= min_chars:
            merged.append(current)
            current = None
    if current is not None:
        if merged:
            last = merged.pop()
            merged.append(Paragraph(last.text + last.sep + current.text, current.sep))
        else:
            merged.append(current)
    return merged


def summary_block(summary: str) -> str:
    return f"{tokens.BEGIN_SUMMARY}{summary.strip()}{tokens.END_SUMMARY}"


def insert_summaries(split: ThoughtSplit, paragraphs: list[Paragraph], summaries: list[str]) -> str:
    """The response with ``\\n\\n<|begin_of_summary|>s_i<|end_of_summary|>`` after paragraph i."""
    if len(paragraphs) != len(summaries):
        raise ValueError(f"{len(paragraphs)} paragraphs but {len(summaries)} summaries")
    body = "".join(f"{p.text}\n\n{summary_block(s)}{p.sep}" for p, s in zip(paragraphs, summaries))
    return split.prefix + body + split.suffix


# ---------------------------------------------------------------- token level


@dataclass
class Segment:
    """Segment i: regular span R_i = [r_start, r_end) and summary span S_i = [s_start, s_end)."""

    index: int
    r_start: int
    r_end: int
    s_start: int
    s_end: int

    @property
    def regular(self) -> range:
        return range(self.r_start, self.r_end)

    @property
    def summary(self) -> range:
        return range(self.s_start, self.s_end)

    @property
    def summary_content(self) -> range:
        """The summary without its two delimiters (empty for an empty summary)."""
        return range(self.s_start + 1, self.s_end - 1)


@dataclass
class SegmentTracker:
    """Incremental R_i / S_i bookkeeping from generated token ids (one tracker per sequence).

    ``start`` is the position of the first tracked token (the prompt length: the prompt is kept whole
    and is not a segment). Malformed delimiter use by the model is counted, never fatal: a second
    ``<|begin_of_summary|>`` inside a summary restarts it, an ``<|end_of_summary|>`` outside one is ignored.
    """

    begin_id: int
    end_id: int
    start: int = 0
    segments: list[Segment] = field(default_factory=list)
    open_start: int = field(init=False)  # first position of the regular segment being written
    summary_start: int | None = field(default=None, init=False)
    anomalies: int = field(default=0, init=False)
    length: int = field(init=False)  # next position to be fed

    def __post_init__(self) -> None:
        self.open_start = self.start
        self.length = self.start

    def feed(self, token_id: int) -> Segment | None:
        """Consume the token at position ``self.length``; return the segment it completes, if any."""
        pos = self.length
        self.length += 1
        if token_id == self.begin_id:
            if self.summary_start is not None:
                self.anomalies += 1
            self.summary_start = pos
            return None
        if token_id == self.end_id:
            if self.summary_start is None:
                self.anomalies += 1
                return None
            seg = Segment(
                len(self.segments), self.open_start, self.summary_start, self.summary_start, pos + 1
            )
            self.segments.append(seg)
            self.summary_start = None
            self.open_start = pos + 1
            return seg
        return None

    def feed_many(self, token_ids: list[int]) -> list[Segment]:
        done = [self.feed(int(t)) for t in token_ids]
        return [s for s in done if s is not None]

    @property
    def in_summary(self) -> bool:
        return self.summary_start is not None


def segments_from_ids(token_ids: list[int], begin_id: int, end_id: int, start: int = 0) -> list[Segment]:
    """All complete segments of a token sequence whose tracked part begins at ``start``."""
    tracker = SegmentTracker(begin_id, end_id, start=start)
    tracker.feed_many(token_ids[start:])
    return tracker.segments


# ---------------------------------------------------------------- semantic boundaries

BOUNDARY_MARKS = (".", "!", "?", "...", ":")
BOUNDARY_BREAKS = ("\n\n", "\n\n\n")


def is_semantic_boundary(piece: str) -> bool:
    """ZoomR A.3: the piece ends a sentence (``. ! ? ... :``) or holds a blank line."""
    if any(b in piece for b in BOUNDARY_BREAKS):
        return True
    return piece.rstrip(" \t").endswith(BOUNDARY_MARKS)


def token_pieces(tokenizer, token_ids: list[int] | None = None) -> list[str]:
    """The decoded text of each token on its own (special tokens kept as their strings)."""
    ids = range(len(tokenizer)) if token_ids is None else token_ids
    return [tokenizer.decode([i], skip_special_tokens=False, clean_up_tokenization_spaces=False) for i in ids]


def boundary_table(tokenizer) -> torch.Tensor:
    """Bool tensor over the vocabulary: is token i a semantic boundary?"""
    return torch.tensor([is_semantic_boundary(p) for p in token_pieces(tokenizer)], dtype=torch.bool)
