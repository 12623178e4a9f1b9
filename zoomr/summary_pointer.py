"""Does a query point at its summary? ZoomR's score q_t · k̄_i over a whole sequence (ZoomR §3.3), with gradients.

ZoomR selects the paragraphs to zoom into by the post-RoPE query of the boundary token against each
summary's mean post-RoPE key k̄_i (delimiters excluded, as :class:`zoomr.cache.zoomr.ZoomRCache` does by
default). A pretrained LLM's attention already ties a cue to the summary of the paragraph it needs; a
model trained from scratch learns that tie only if something asks for it. This module computes the
same scores from one teacher-forced forward pass, so that

* :func:`pointer_loss` can train a testbed model's queries to point at the defining summary (an
  auxiliary cross-entropy at cue boundaries, ``+method=sft_testbed method.summary_pointer_weight``);
* :func:`selection_hits` can measure, offline, how often the paper's rule (per-head top-k votes, top-c
  consensus: :func:`zoomr.cache.zoomr.head_votes`, :func:`zoomr.cache.zoomr.consensus`) puts the
  defining paragraph into I_c.

Post-RoPE queries and keys are captured by an attention implementation registered with transformers'
``AttentionInterface`` (:func:`capture_qk`): it records each layer's ``query [B, Hq, T, d]`` and
``key [B, Hkv, T, d]`` (GQA layout: query head h uses KV head h // (Hq / Hkv)) and then runs SDPA.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from zoomr.cache.zoomr import consensus, head_votes

CAPTURE = "summary_pointer_capture"
_ACTIVE: list[dict[int, tuple[torch.Tensor, torch.Tensor]]] = []


def _capture_attention(module: torch.nn.Module, query, key, value, attention_mask, **kwargs: Any):
    if _ACTIVE:
        _ACTIVE[-1][module.layer_idx] = (query, key)
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


AttentionInterface.register(CAPTURE, _capture_attention)
AttentionMaskInterface.register(CAPTURE, sdpa_mask)


@contextmanager
def capture_qk(model: torch.nn.Module) -> Iterator[dict[int, tuple[torch.Tensor, torch.Tensor]]]:
    """Within the block, every forward of ``model`` records ``{layer: (query, key)}`` (post-RoPE) into the
    yielded dict (the latest forward's; gradients kept). The model's attention implementation is restored after."""
    previous = model.config._attn_implementation
    model.set_attn_implementation(CAPTURE)
    store: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    _ACTIVE.append(store)
    try:
        yield store
    finally:
        del _ACTIVE[next(i for i, s in enumerate(_ACTIVE) if s is store)]  # by identity: == compares tensors
        model.set_attn_implementation(previous)


@dataclass
class Cue:
    """A recompute position whose query should point at summary ``target`` (0-based segment index)."""

    pos: int  # token index in the sequence (the boundary token after the cue)
    target: int
    far: bool = False  # the defining paragraph lies outside ZoomR's recent window at this position
    first: int | None = None  # the cue's first row after "?": the key, or the topic of "? t k :"; None = pos - 1

    @property
    def start(self) -> int:
        """The cue's first row after ``?`` (``pos - 1`` unless ``first`` is given)."""
        return self.pos - 1 if self.first is None else self.first


def with_key_cues(cues: Sequence[Sequence[Cue]]) -> list[list[Cue]]:
    """Each sequence's cues plus, for each, the same target at the cue's first word (its key, or its paragraph
    topic in ``? t k :``): the word that names what to recall."""
    return [[*cs, *(Cue(c.start, c.target, c.far) for c in cs)] for cs in cues]


def mean_summary_keys(key: torch.Tensor, spans: Sequence[tuple[int, int]]) -> torch.Tensor:
    """k̄_i ``[Hkv, M, d]`` of one sequence: the mean of ``key [Hkv, T, d]`` over each summary's rows [start, end).

    An empty summary (``start == end``: its delimiters ``start - 1`` and ``end`` hold nothing between them) averages
    its two delimiters' keys, as :class:`zoomr.cache.zoomr.ZoomRCache` does (its k̄ was NaN, which took a top-k slot
    of every head and voted for nothing). A span outside the sequence or reversed is refused (``ValueError``)."""
    if not spans:
        return key.new_zeros(key.shape[0], 0, key.shape[2])
    T, rows = key.shape[1], []
    for i, (a, b) in enumerate(spans):
        if a == b:
            a, b = a - 1, b + 1
        if not 0 <= a < b <= T:
            raise ValueError(f"summary span {i} = {spans[i]}: not the content rows of a summary in a {T}-row sequence")
        rows.append(key[:, a:b].mean(dim=1))
    return torch.stack(rows, dim=1)


def pointer_scores(query: torch.Tensor, kbar: torch.Tensor) -> torch.Tensor:
    """α = q · k̄ ``[Hq, N, M]`` from ``query [Hq, N, d]`` (the cues' rows) and ``kbar [Hkv, M, d]`` (GQA grouping)."""
    Hq, N, d = query.shape
    Hkv, M = kbar.shape[0], kbar.shape[1]
    g = Hq // Hkv
    return torch.einsum("kgnd,kmd->kgnm", query.reshape(Hkv, g, N, d), kbar).reshape(Hq, N, M)


def _live(spans: Sequence[tuple[int, int]], cues: Sequence[Cue], device) -> torch.Tensor:
    """``[N, M]``: summary m is complete (its end delimiter fed) before cue n's boundary."""
    ends = torch.tensor([b for _, b in spans], device=device)  # the end delimiter sits at row b
    return ends[None, :] < torch.tensor([c.pos for c in cues], device=device)[:, None]


def check_targets(spans: Sequence[tuple[int, int]], cues: Sequence[Cue], live: bool = True, b: int = 0) -> None:
    """Refuse (``ValueError`` naming the sequence and cue) a cue whose target is no summary of ``spans`` or, with
    ``live``, one whose summary is not complete before the cue (it cannot compete: the loss was inf, then NaN)."""
    for c in cues:
        if not 0 <= c.target < len(spans):
            raise ValueError(f"sequence {b}: the cue at row {c.pos} targets summary {c.target}, but there are "
                             f"{len(spans)} summaries (0..{len(spans) - 1})")  # fmt: skip
        if live and not spans[c.target][1] < c.pos:
            raise ValueError(f"sequence {b}: the cue at row {c.pos} targets summary {c.target}, which ends at row "
                             f"{spans[c.target][1]}: not complete before the cue, so it cannot be pointed at")  # fmt: skip


def pointer_loss(
    qk: dict[int, tuple[torch.Tensor, torch.Tensor]],
    spans: Sequence[Sequence[tuple[int, int]]],
    cues: Sequence[Sequence[Cue]],
    layers: Sequence[int],
    margin: float | None = None,
) -> torch.Tensor | None:
    """Mean cross-entropy of softmax_i(q · k̄_i / sqrt(d)) toward each cue's defining summary, over the given
    layers, every query head and every cue of the batch (``spans[b]``/``cues[b]`` per sequence); None if no cue.

    The scale 1/sqrt(d) leaves the ranking (what ZoomR's top-k reads) unchanged; only completed summaries compete.
    ``margin`` (a variant): the hinge max(0, margin − (α_target − max_{i ≠ target} α_i)) on the same scaled
    scores instead, which spends the whole gradient on the heads whose strongest competitor is within the margin.
    """
    terms, count = [], 0
    for b, (sp, cs) in enumerate(zip(spans, cues)):
        if cs and sp:
            check_targets(sp, cs, b=b)
    for layer in layers:
        query, key = qk[layer]
        d = query.shape[-1]
        for b, (sp, cs) in enumerate(zip(spans, cues)):
            if not cs or not sp:
                continue
            pos = torch.tensor([c.pos for c in cs], device=query.device)
            alpha = pointer_scores(query[b][:, pos], mean_summary_keys(key[b], sp)) * d**-0.5  # [Hq, N, M]
            alpha = alpha.masked_fill(~_live(sp, cs, query.device)[None], float("-inf"))
            target = torch.tensor([c.target for c in cs], device=query.device)
            Hq = alpha.shape[0]
            if margin is None:
                terms.append(F.cross_entropy(alpha.flatten(0, 1), target.repeat(Hq), reduction="sum") / Hq)
            else:
                terms.append(_hinge(alpha, target, margin).sum() / Hq)
            count += len(cs)
    return torch.stack(terms).sum() / count if count else None


def _hinge(alpha: torch.Tensor, target: torch.Tensor, margin: float) -> torch.Tensor:
    """``[Hq, N]``: max(0, margin − (α_target − strongest competitor)); 0 where the target has no competitor."""
    own = alpha.gather(-1, target[None, :, None].expand(alpha.shape[0], -1, 1)).squeeze(-1)
    others = alpha.scatter(-1, target[None, :, None].expand(alpha.shape[0], -1, 1), float("-inf"))
    rival = others.max(-1).values
    gap = torch.where(torch.isfinite(rival), own - rival, torch.full_like(own, float(margin)))
    return F.relu(margin - gap)


def value_read_loss(
    qk: dict[int, tuple[torch.Tensor, torch.Tensor]],
    input_ids: torch.Tensor,
    starts: Sequence[int],
    cues: Sequence[Sequence[Cue]],
    layers: Sequence[int],
) -> torch.Tensor | None:
    """Mean over cues of −log of the attention the ``=`` row after each cue's ``:`` pays to the row holding
    the queried value in its defining paragraph (``k v``: the row after the key's first response occurrence),
    averaged over the query heads of ``layers`` (a mixture: one head reading the value suffices); None if no cue.

    A testbed-model training device (``method.value_read_weight``) for the cue-view stage, where the key and
    ``:`` rows are blind to the paragraph and the value must be read at ``=``: some models never move their
    reading there (analysis/results/zoomr_testbed/HISTORY.md, attempt 9). Causal softmax of q · k / sqrt(d) over
    every earlier row, as the ``=`` row attends in that stage.
    """
    terms = []
    for b, cs in enumerate(cues):
        ids, T = input_ids[b], input_ids.shape[1]
        rows, values = [], []
        for c in cs:
            if c.pos + 1 >= T:
                continue
            seen = (ids[starts[b] : c.pos - 1] == ids[c.pos - 1]).nonzero()
            if len(seen):
                rows.append(c.pos + 1)
                values.append(starts[b] + int(seen[0]) + 1)
        if not rows:
            continue
        dev = input_ids.device
        row, value = torch.tensor(rows, device=dev), torch.tensor(values, device=dev)
        causal = torch.arange(T, device=dev)[None, :] <= row[:, None]  # [N, T]
        mix, heads = 0.0, 0
        for layer in layers:
            query, key = qk[layer]
            Hq, d = query.shape[1], query.shape[-1]
            logits = pointer_scores(query[b][:, row], key[b]) * d**-0.5  # every row as a "summary" of one key
            p = logits.masked_fill(~causal[None], float("-inf")).softmax(-1)  # [Hq, N, T]
            mix = mix + p.gather(-1, value[None, :, None].expand(Hq, -1, 1)).squeeze(-1).sum(0)
            heads += Hq
        terms.append(-torch.log(mix / heads + 1e-9))
    return torch.cat(terms).mean() if terms else None


def key_spread_penalty(embedding: torch.Tensor, key_ids: Sequence[int]) -> torch.Tensor:
    """Mean squared cosine between the centred input embeddings of distinct keys (off-diagonal pairs).

    A testbed-model training device (``method.key_spread_weight``): a summary's score q · k̄ averages its keys,
    so a cue's key whose embedding lies close to another summary's keys lets that summary win; trained on the
    task alone, the 256 keys crowd into ~23 of 128 dims (mean pairwise cosine 0.19, nearest 0.53 vs 0.25
    for random vectors). 0 when the keys are orthogonal after centring. Measured: spreading them to random level
    left ZoomR's misses unchanged (analysis/results/zoomr_testbed/HISTORY.md, attempt 9 i)."""
    x = embedding[torch.as_tensor(list(key_ids), device=embedding.device)]
    x = F.normalize(x - x.mean(0), dim=-1)
    gram = x @ x.T
    n = gram.shape[0]
    return (gram.square().sum() - gram.diagonal().square().sum()) / (n * (n - 1))


def target_ranks(
    qk: dict[int, tuple[torch.Tensor, torch.Tensor]],
    spans: Sequence[tuple[int, int]],
    cues: Sequence[Cue],
    layers: Sequence[int],
    b: int = 0,
) -> torch.Tensor:
    """``[N, len(layers) * Hq]`` long: at each cue of sequence ``b``, the 0-based rank of its defining summary
    by q · k̄ among the summaries completed before it, per (layer, query head); rank < k means the head votes for it."""
    live = _live(spans, cues, "cpu")  # [N, M]
    pos = torch.tensor([c.pos for c in cues])
    target = torch.tensor([c.target for c in cues])
    out = []
    for layer in layers:
        query, key = qk[layer]
        q = query[b][:, pos.to(query.device)].detach().float()  # [Hq, N, d]
        alpha = pointer_scores(q, mean_summary_keys(key[b].detach().float(), spans)).cpu()  # [Hq, N, M]
        alpha = alpha.masked_fill(~live[None], float("-inf"))
        own = alpha.gather(-1, target[None, :, None].expand(alpha.shape[0], -1, 1))
        out.append((alpha > own).sum(-1).T)  # [N, Hq]
    return torch.cat(out, dim=1)


@dataclass
class Selection:
    """The paper's rule at one cue: I_c, the vote count of the target, whether I_c holds it."""

    zoomed: list[int]
    target_votes: int
    hit: bool
    far: bool
    n_summaries: int
    agreeability: float | None
    summarized: list[int] = field(default_factory=list)  # I_s: voted for, not zoomed (their summaries stay)


def selection_hits(
    qk: dict[int, tuple[torch.Tensor, torch.Tensor]],
    spans: Sequence[tuple[int, int]],
    cues: Sequence[Cue],
    top_k: int,
    c: int,
    layers: Sequence[int] | None = None,
    b: int = 0,
) -> list[Selection]:
    """For sequence ``b``: at each cue, every (layer, query head) votes for its top-k summaries among those
    completed (:func:`zoomr.cache.zoomr.head_votes`), I_c = the top-c by votes (:func:`~zoomr.cache.zoomr.consensus`);
    a hit = the cue's defining summary is in I_c. ``layers=None``: every layer (the paper's rule)."""
    out: list[Selection] = []
    if not cues or not spans:
        return out
    check_targets(spans, cues, live=False, b=b)  # a cue before its summary is complete is a miss
    layer_ids = sorted(qk) if layers is None else list(layers)
    live = _live(spans, cues, "cpu").sum(1)  # summaries completed before each cue (they form a prefix)
    votes = torch.zeros(len(cues), len(spans), dtype=torch.long)
    pos = torch.tensor([cue.pos for cue in cues])
    for layer in layer_ids:
        query, key = qk[layer]
        q = query[b][:, pos.to(query.device)].detach().float().transpose(0, 1)  # [N, Hq, d]
        kbar = mean_summary_keys(key[b].detach().float(), spans)  # [Hkv, M, d]
        kb = kbar[None].expand(len(cues), *kbar.shape)
        votes += head_votes(q, kb, live, top_k).cpu()
    for n, cue in enumerate(cues):
        m = int(live[n])
        res = consensus(votes[n, :m], c)
        out.append(
            Selection(res.zoomed, int(votes[n, cue.target]), cue.target in res.zoomed, cue.far, m, res.agreeability,
                      res.summarized)
        )  # fmt: skip
    return out


def count_hits(
    qk: dict[int, tuple[torch.Tensor, torch.Tensor]],
    spans: Sequence[Sequence[tuple[int, int]]],
    cues: Sequence[Sequence[Cue]],
    top_k: int,
    c: int,
    layers: Sequence[int] | None = None,
) -> dict[str, int]:
    """Hits and cues of the rule over a batch (``spans[b]``/``cues[b]`` per sequence), overall and far."""
    out = {"hits": 0, "cues": 0, "far_hits": 0, "far_cues": 0, "chance": 0.0}
    for b, (sp, cs) in enumerate(zip(spans, cues)):
        for s in selection_hits(qk, sp, cs, top_k, c, layers, b=b):
            out["hits"] += s.hit
            out["cues"] += 1
            out["far_hits"] += s.hit and s.far
            out["far_cues"] += s.far
            out["chance"] += min(1.0, c / max(1, s.n_summaries))
    return out
