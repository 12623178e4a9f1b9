"""The training stream of the recall testbed: fresh problems every step, a length curriculum, a copy warm-up.

Recipe from the feasibility study (shared/specs/TESTBED_NOTES.md): the maximum trace length grows
geometrically from ``start_tokens`` to the target over the first ``grow_fraction`` of the steps, then
``full_length_fraction`` of the batches are full length; filler grows with the length (none at the
start, the full range from ``filler_full_at``); during the first ``copy_warmup_fraction`` of the steps
every other batch is "a random block repeated twice" (loss on the repeat), the task that forms
induction heads, which every step of the testbed trace (plan copying, value lookup, recall) uses.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

import torch

from data_prep import testbed_tokenizer as tt
from data_prep.testbed import generate
from zoomr.schemas.testbed import CurriculumSettings, TestbedData

IGNORE = -100


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T], right padded
    labels: torch.Tensor  # [B, T] next-token targets already aligned to input positions (IGNORE = no loss)
    answer_mask: torch.Tensor  # [B, T] bool: label is a query-answer value
    distances: torch.Tensor  # [B, T] reference distance of an answer label (-1 elsewhere)
    kind: str  # "trace" | "copy"
    trace_tokens: int  # the length bound this batch was generated at (0 for copy batches)

    @property
    def tokens(self) -> int:
        return int(self.input_ids.numel())


def max_length_at(step: int, total: int, target: int, cur: CurriculumSettings) -> int:
    """The curriculum's length bound at ``step`` (geometric growth, then the target)."""
    grow = max(1, int(cur.grow_fraction * total))
    if step >= grow or cur.start_tokens >= target:
        return target
    return int(round(cur.start_tokens * (target / cur.start_tokens) ** (step / grow)))


def scaled_data(data: TestbedData, length: int, cur: CurriculumSettings) -> TestbedData:
    """``data`` at trace length ``length`` with the filler range scaled to it."""
    span = max(1, cur.filler_full_at - cur.start_tokens)
    s = min(1.0, max(0.0, (length - cur.start_tokens) / span))
    lo, hi = data.filler
    return replace(data, trace_tokens=length, filler=[round(lo * s), round(hi * s)])


def encode_problem(problem, enc: tt.FastEncoder) -> tuple[list[int], list[int], list[int]]:
    """(ids, labels aligned to ids, per-position answer distance or -1). Labels cover the response + <|im_end|>."""
    ids, start = enc.chat(problem.prompt_words, problem.response_words)
    labels = [IGNORE] * len(ids)
    for t in range(start - 1, len(ids) - 1):
        labels[t] = ids[t + 1]
    dist = [-1] * len(ids)
    for q in problem.queries:
        dist[start + q.answer_pos - 1] = q.distance  # position whose next token is the answer
    return ids, labels, dist


def collate(rows: list[tuple[list[int], list[int], list[int]]], pad_id: int, kind: str, length: int) -> Batch:
    width = max(len(r[0]) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    dist = torch.full((len(rows), width), -1, dtype=torch.long)
    for b, (i, lab, d) in enumerate(rows):
        ids[b, : len(i)] = torch.tensor(i)
        labels[b, : len(lab)] = torch.tensor(lab)
        dist[b, : len(d)] = torch.tensor(d)
    return Batch(ids, labels, dist >= 0, dist, kind, length)


def trace_batch(data: TestbedData, length: int, tokens_per_step: int, rng: random.Random, enc, pad_id: int) -> Batch:
    """Fresh problems of length bound ``length`` until the batch holds about ``tokens_per_step`` tokens."""
    rows, total = [], 0
    while total < tokens_per_step or not rows:
        row = encode_problem(generate(data, rng), enc)
        rows.append(row)
        total += len(row[0])
    return collate(rows, pad_id, "trace", length)


def copy_batch(cur: CurriculumSettings, tokens_per_step: int, rng: random.Random, enc, pad_id: int) -> Batch:
    """Random blocks of content words, each repeated twice; loss on the repeat only."""
    words = [w for w in tt.vocabulary() if w[0] in "kQv#Pw" and w not in (tt.VALUES_HEADER, tt.PLAN_HEADER)]
    block = rng.randint(*cur.copy_block)
    rows = []
    for _ in range(max(1, tokens_per_step // (2 * block))):
        ids = enc.words(rng.choices(words, k=block))
        seq = ids + ids
        labels = [IGNORE] * block + seq[block + 1 :] + [IGNORE]
        labels[block - 1] = seq[block]
        rows.append((seq, labels, [-1] * len(seq)))
    return collate(rows, pad_id, "copy", 0)


class Curriculum:
    """Deterministic batch stream: batch ``step`` depends only on (seed, step), so resuming is exact."""

    def __init__(self, data: TestbedData, cur: CurriculumSettings, total_steps: int, tokens_per_step: int, enc):
        self.data, self.cur, self.total, self.tokens_per_step, self.enc = data, cur, total_steps, tokens_per_step, enc
        self.pad_id = enc.ids[tt.tokens.PAD]

    def length_for(self, step: int, rng: random.Random) -> int:
        cur, target = self.cur, self.data.trace_tokens
        bound = max_length_at(step, self.total, target, cur)
        grown = bound >= target
        if rng.random() < (cur.full_length_fraction if grown else 0.5):
            return bound
        lo = min(cur.start_tokens, bound)
        return int(round(math.exp(rng.uniform(math.log(lo), math.log(bound)))))

    def batch(self, step: int) -> Batch:
        rng = random.Random(f"curriculum/{self.data.seed}/{step}")
        if step < self.cur.copy_warmup_fraction * self.total and step % 2 == 1:
            return copy_batch(self.cur, self.tokens_per_step, rng, self.enc, self.pad_id)
        length = self.length_for(step, rng)
        return trace_batch(scaled_data(self.data, length, self.cur), length, self.tokens_per_step, rng, self.enc, self.pad_id)
