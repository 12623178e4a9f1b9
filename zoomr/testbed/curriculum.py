"""The training stream of the recall testbed: two warm-up tasks, then fresh traces under a length curriculum.

Recipe from the feasibility study (shared/specs/TESTBED_NOTES.md), adapted to transformers' Llama:

1. ``copy_steps`` batches of "a random block repeated twice" (loss on the repeat): the task that forms
   induction heads (find the earlier occurrence of the current token, copy its successor).
2. ``recall_steps`` batches of bare associative recall (facts ``k v``, then every key queried, ``? k v``).
3. Traces: the maximum length grows geometrically from ``start_tokens`` to the target over the first
   ``grow_fraction`` of the remaining steps, then ``full_length_fraction`` of the batches are full length;
   filler grows with the length (none at the start, the full ranges from ``filler_full_at``).

Every warm-up row starts with the testbed's chat prompt, as traces do. Why the phases (measured on this
CPU, 2-layer d=128 model): the recipe's interleaving (every other batch a copy over the first 15% of the
steps) left recall at a guess-a-value-in-context plateau (12% at step 600 of 1,200); induction heads
formed only after ~250-550 dedicated copy steps in every run; after them, bare recall was learned in ~100 steps, but
chat-formatted traces were not always (one seed: 99% in 100 steps, another: 25% after 150), while
copy → recall → traces learned the traces in every run so far.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

import torch

from zoomr.schemas.checks import SettingsError
from zoomr.schemas.testbed import CurriculumSettings, TestbedData
from zoomr.summary_pointer import Cue
from zoomr.testbed import vocab as tt
from zoomr.testbed.task import generate, validate

IGNORE = -100


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T], right padded
    labels: torch.Tensor  # [B, T] next-token targets already aligned to input positions (IGNORE = no loss)
    answer_mask: torch.Tensor  # [B, T] bool: label is a query-answer value
    distances: torch.Tensor  # [B, T] reference distance of an answer label (-1 elsewhere)
    kind: str  # "trace" | "copy"
    trace_tokens: int  # the length bound this batch was generated at (0 for copy batches)
    spans: list[list[tuple[int, int]]] | None = None  # per row: summary content rows [start, end) (traces)
    cues: list[list[Cue]] | None = None  # per row: query boundaries and the summary that defined the fact
    starts: list[int] | None = None  # per row: the first response row (rows before it are the prompt)

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
    """``data`` at trace length ``length`` with the filler ranges scaled to it."""
    span = max(1, cur.filler_full_at - cur.start_tokens)
    s = min(1.0, max(0.0, (length - cur.start_tokens) / span))
    return replace(
        data,
        trace_tokens=length,
        filler_before=[round(v * s) for v in data.filler_before],
        filler_after=[round(v * s) for v in data.filler_after],
    )


def check_lengths(data: TestbedData, cur: CurriculumSettings) -> None:
    """Refuse (:class:`SettingsError`) a curriculum whose shortest traces (``start_tokens``, or the target when it is
    shorter) cannot hold one paragraph and the answer: the first trace batch, after the copy and recall steps, raised
    it, and a resumed run raised it again at the same step."""
    shortest = min(cur.start_tokens, data.trace_tokens)
    try:
        validate(scaled_data(data, shortest, cur))
    except SettingsError as e:
        raise SettingsError(f"method.curriculum.start_tokens={cur.start_tokens}: the curriculum's shortest traces are "
                            f"too short for this data ({e}); raise it") from None  # fmt: skip


def encode_problem(problem, enc: tt.FastEncoder, window: int = 64) -> tuple[list[int], list[int], list[int], dict]:
    """(ids, labels aligned to ids, per-position answer distance or -1, summary spans and cues in ids
    coordinates). Labels only where the model writes. A cue is ``far`` when its fact's definition lies
    outside a recent ``window`` of rows at the cue's boundary (ZoomR's N_w)."""
    ids, start = enc.chat(problem.prompt_words, problem.response_words)
    labels = [IGNORE] * len(ids)
    for pos in problem.model_writes:
        labels[start + pos - 1] = ids[start + pos]
    dist = [-1] * len(ids)
    for q in problem.queries:
        dist[start + q.answer_pos - 1] = q.distance  # position whose next token is the answer
    spans = [(start + a, start + b) for a, b in problem.summary_spans]
    cues = [
        Cue(start + q.cue_pos, q.fact.paragraph - 1, q.fact.definition_pos < q.cue_pos + 1 - window, start + q.cue_first)
        for q in problem.queries
    ] if spans else []
    return ids, labels, dist, {"spans": spans, "cues": cues, "start": start}


def collate(rows: list[tuple], pad_id: int, kind: str, length: int) -> Batch:
    width = max(len(r[0]) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    dist = torch.full((len(rows), width), -1, dtype=torch.long)
    for b, (i, lab, d, *_) in enumerate(rows):
        ids[b, : len(i)] = torch.tensor(i)
        labels[b, : len(lab)] = torch.tensor(lab)
        dist[b, : len(d)] = torch.tensor(d)
    meta = [r[3] for r in rows if len(r) > 3]
    spans = [m["spans"] for m in meta] if len(meta) == len(rows) else None
    cues = [m["cues"] for m in meta] if len(meta) == len(rows) else None
    starts = [m["start"] for m in meta] if len(meta) == len(rows) else None
    return Batch(ids, labels, dist >= 0, dist, kind, length, spans, cues, starts)


def trace_batch(data: TestbedData, length: int, tokens_per_step: int, rng: random.Random, enc, pad_id: int) -> Batch:
    """Fresh problems of length bound ``length`` until the batch holds about ``tokens_per_step`` tokens."""
    rows, total = [], 0
    while total < tokens_per_step or not rows:
        row = encode_problem(generate(data, rng), enc)
        rows.append(row)
        total += len(row[0])
    return collate(rows, pad_id, "trace", length)


def copy_batch(cur: CurriculumSettings, tokens_per_step: int, rng: random.Random, enc, pad_id: int) -> Batch:
    """Random blocks of content words, each repeated twice after a random prefix; loss on the repeat only.

    Block and prefix lengths vary per row, so no fixed offset solves it: only an induction head (find the
    earlier occurrence of the current token, copy its successor) does. Rows start with the testbed's chat
    prompt, as traces do: induction heads formed without it did not carry over to chat-formatted traces
    (measured: after the same copy phase, recall on 64-token traces stayed at 25% with the chat header
    and reached 99.9% without it).
    """
    from zoomr.testbed.task import PROMPT_WORDS

    words = [w for w in tt.vocabulary() if w[0] in "kvw" and w[1:].isdigit()]
    head = enc.prompt(PROMPT_WORDS)
    rows, total = [], 0
    while total < tokens_per_step:
        block = rng.randint(*cur.copy_block)
        prefix = head + enc.words(rng.choices(words, k=rng.randint(0, block // 2)))
        ids = enc.words(rng.choices(words, k=block))
        seq = prefix + ids + ids
        start = len(prefix) + block
        labels = [IGNORE] * start + seq[start + 1 :] + [IGNORE]  # the repeat's first token is unpredictable
        rows.append((seq, labels, [-1] * len(seq)))
        total += len(seq)
    return collate(rows, pad_id, "copy", 0)


def recall_batch(
    cur: CurriculumSettings, tokens_per_step: int, rng: random.Random, enc, pad_id: int, form: str = "cue"
) -> Batch:
    """Bare associative recall in the chat format (MQAR, Arora et al. 2023): ``n`` facts ``k v``, then every
    key queried once in random order, in the data's query form (``? k : = v``); loss on the answers. The
    bridge from copying to the trace."""
    from zoomr.testbed.task import PROMPT_WORDS

    head = enc.prompt(PROMPT_WORDS)
    query = enc.ids[tt.QUERY]
    gap = enc.words([tt.QUERY_END, tt.ANSWER_MARK]) if form == "cue" else []
    rows, total = [], 0
    while total < tokens_per_step:
        n = rng.randint(*cur.recall_facts)
        keys = rng.sample(range(tt.N_KEYS), n)
        values = [rng.randrange(tt.N_VALUES) for _ in keys]
        seq = head + [i for k, v in zip(keys, values) for i in enc.words([tt.key(k), tt.value(v)])]
        labels = [IGNORE] * len(seq)
        for j in rng.sample(range(n), n):
            seq += [query, *enc.words([tt.key(keys[j])]), *gap, *enc.words([tt.value(values[j])])]
            labels += [IGNORE] * (1 + len(gap)) + [seq[-1], IGNORE]
        rows.append((seq, labels, [-1] * len(seq)))
        total += len(seq)
    return collate(rows, pad_id, "recall", 0)


class Curriculum:
    """Deterministic batch stream: batch ``step`` depends only on (seed, step), so resuming is exact."""

    def __init__(self, data: TestbedData, cur: CurriculumSettings, total_steps: int, tokens_per_step: int, enc):
        self.data, self.cur, self.total, self.tokens_per_step, self.enc = data, cur, total_steps, tokens_per_step, enc
        self.pad_id = enc.ids[tt.tokens.PAD]

    @property
    def trace_steps(self) -> int:
        return max(1, self.total - self.cur.copy_steps - self.cur.recall_steps)

    def length_for(self, step: int, rng: random.Random) -> int:
        """Length bound of trace batch ``step`` (counted from the end of the copy phase)."""
        cur, target = self.cur, self.data.trace_tokens
        bound = max_length_at(step, self.trace_steps, target, cur)
        grown = bound >= target
        if rng.random() < (cur.full_length_fraction if grown else 0.5):
            return bound
        lo = min(cur.start_tokens, bound)
        return int(round(math.exp(rng.uniform(math.log(lo), math.log(bound)))))

    def batch(self, step: int) -> Batch:
        rng = random.Random(f"curriculum/{self.data.seed}/{step}")
        cur = self.cur
        if step < cur.copy_steps:
            return copy_batch(cur, cur.copy_tokens_per_step, rng, self.enc, self.pad_id)
        if step < cur.copy_steps + cur.recall_steps:
            return recall_batch(cur, cur.copy_tokens_per_step, rng, self.enc, self.pad_id, self.data.query_form)
        trace_step = step - cur.copy_steps - cur.recall_steps
        if trace_step < cur.copy_warmup_fraction * self.trace_steps and trace_step % 2 == 1:
            return copy_batch(cur, cur.copy_tokens_per_step, rng, self.enc, self.pad_id)
        length = self.length_for(trace_step, rng)
        return trace_batch(scaled_data(self.data, length, self.cur), length, self.tokens_per_step, rng, self.enc, self.pad_id)
