"""Teacher-forced evaluation of a testbed model (full KV, the argmax next token; what training logs).

Accuracy on the answers by reference distance (:data:`zoomr.testbed.grading.BUCKETS`), on every response
token and per token kind, on held-out full-length traces; with summaries, the selection hit rate of ZoomR's
rule at every cue boundary (:func:`zoomr.summary_pointer.count_hits`, the paper's k = c = 2). With a cue-view
window (:mod:`zoomr.testbed.cue_view`), the same answers and hits again under ZoomR's decoding-time view at
each cue's key and boundary rows (``*_cue_view``): what ZoomR decoding can reach when its selection hits.
"""

from __future__ import annotations

import torch

from zoomr.schemas.testbed import TestbedData
from zoomr.summary_pointer import count_hits
from zoomr.testbed.cue_view import batch_cue_view
from zoomr.testbed.curriculum import Batch, collate, encode_problem
from zoomr.testbed.grading import BUCKETS
from zoomr.testbed.task import problems

TOKEN_KINDS = {"k": "key", "v": "value", "w": "filler"}


def token_kinds(tokenizer) -> tuple[torch.Tensor, list[str]]:
    """vocab id → kind id (key, query, value, index, para, filler, other), for per-kind accuracy."""
    names = [*TOKEN_KINDS.values(), "other"]
    kinds = torch.full((len(tokenizer),), len(names) - 1, dtype=torch.long)
    for word, i in tokenizer.get_vocab().items():
        if word[:1] in TOKEN_KINDS and word[1:].isdigit():
            kinds[i] = names.index(TOKEN_KINDS[word[0]])
    return kinds, names


@torch.no_grad()
def teacher_forced_eval(
    model,
    batches: list[Batch],
    kinds: tuple[torch.Tensor, list[str]] | None = None,
    qk: dict | None = None,
    cue_view_window: int | None = None,
) -> dict[str, float]:
    """Accuracy of the argmax next token: on answers (by distance bucket), on every response token, per kind;
    with ``qk`` (a :func:`~zoomr.summary_pointer.capture_qk` store) and summaries, the pointer hit rate too;
    with ``cue_view_window``, answer accuracy and hit rate under the cue view as well."""
    out = _full_view_eval(model, batches, kinds, qk)
    if cue_view_window is not None:
        out.update(_cue_view_eval(model, batches, qk, cue_view_window))
    return out


@torch.no_grad()
def _cue_view_eval(model, batches: list[Batch], qk: dict | None, window: int) -> dict[str, float]:
    model.eval()
    answers, far, pointer = [0, 0], [0, 0], [0, 0]
    for b in batches:
        mask = batch_cue_view(b, window)
        if mask is None:
            continue
        ok = model(input_ids=b.input_ids, attention_mask=mask).logits.argmax(-1) == b.labels
        far_rows = b.answer_mask & (b.distances >= window)
        answers = [answers[0] + int((ok & b.answer_mask).sum()), answers[1] + int(b.answer_mask.sum())]
        far = [far[0] + int((ok & far_rows).sum()), far[1] + int(far_rows.sum())]
        if qk is not None:
            counts = count_hits(qk, b.spans, b.cues, top_k=2, c=2)
            pointer = [pointer[0] + counts["hits"], pointer[1] + counts["cues"]]
    model.train()
    out = {}
    if answers[1]:
        out["tf_answer_all_cue_view"] = answers[0] / answers[1]
        out["tf_answer_far_cue_view"] = far[0] / max(1, far[1])
    if pointer[1]:
        out["tf_pointer_hit_cue_view"] = pointer[0] / pointer[1]
    return out


@torch.no_grad()
def _full_view_eval(model, batches: list[Batch], kinds, qk: dict | None) -> dict[str, float]:
    model.eval()
    hits = {name: [0, 0] for *_, name in BUCKETS}
    tok = [0, 0]
    per_kind: dict[str, list[int]] = {}
    pointer = {"hits": 0, "cues": 0, "far_hits": 0, "far_cues": 0, "chance": 0.0}
    for b in batches:
        pred = model(input_ids=b.input_ids).logits.argmax(-1)
        if qk is not None and b.cues:
            counts = count_hits(qk, b.spans, b.cues, top_k=2, c=2)  # the paper's rule, ZoomR's defaults
            pointer = {k: pointer[k] + counts[k] for k in pointer}
        lab = b.labels != -100
        ok = pred == b.labels
        tok[0] += int((ok & lab).sum())
        tok[1] += int(lab.sum())
        for lo, hi, name in BUCKETS:
            m = b.answer_mask & (b.distances >= lo) & (b.distances < hi)
            hits[name][0] += int((ok & m).sum())
            hits[name][1] += int(m.sum())
        if kinds is not None:
            kid = kinds[0][b.labels.clamp(min=0)]
            for i, name in enumerate(kinds[1]):
                m = lab & (kid == i) & ~b.answer_mask
                acc = per_kind.setdefault(name, [0, 0])
                acc[0] += int((ok & m).sum())
                acc[1] += int(m.sum())
    model.train()
    out = {f"tf_answer_{k}": h / max(1, n) for k, (h, n) in hits.items()}
    out["tf_answer_all"] = sum(h for h, _ in hits.values()) / max(1, sum(n for _, n in hits.values()))
    out["tf_token_acc"] = tok[0] / max(1, tok[1])
    out.update({f"kind_{k}": h / n for k, (h, n) in per_kind.items() if n})
    if pointer["cues"]:
        out["tf_pointer_hit"] = pointer["hits"] / pointer["cues"]
        out["tf_pointer_hit_far"] = pointer["far_hits"] / max(1, pointer["far_cues"])
        out["tf_pointer_chance"] = pointer["chance"] / pointer["cues"]
    return out


def held_out_batches(data: TestbedData, n: int, enc, pad_id: int) -> list[Batch]:
    rows = [encode_problem(p, enc) for p in problems(data, n, seed=data.test_seed + 7919)]
    return [collate(rows[i : i + 4], pad_id, "trace", data.trace_tokens) for i in range(0, len(rows), 4)]
