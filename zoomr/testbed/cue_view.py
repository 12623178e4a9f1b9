"""ZoomR's view at the cue, in the training forward: where the lookup must happen (issue 13).

During ZoomR decoding (:class:`zoomr.cache.zoomr.ZoomRCache`) the rows of a cue ``? k :`` are computed
under the selection made at the *previous* boundary (``?`` itself is one, ZoomR A.3): they see the prompt,
the recent window, and only the paragraphs and summaries that selection voted for, not in general the
paragraph that defines ``k`` nor its summary. The selection made at ``:`` applies from the next row (``=``).
Measured teacher-forced on the validation seed, a model trained with full attention fails both ways: it
fetches the value at the key token (``=`` restricted to ZoomR's view answers 1.000, but with the key and
``:`` rows also blind to the paragraph 0.029), and once trained to fetch at ``=``, its ``:`` query finds the
summary by attending to it (hiding the summaries from the two rows drops the hit on final answers from 0.961
to 0.047), which decoding does not allow (decoded hit on final answers 0.646).

This mask gives the training forward what those two rows are sure to see under ZoomR: the prompt and the
last ``window`` rows. Every other row attends causally as usual. So the value can only be read at ``=``,
from the zoomed-in paragraph, and the pointer at ``:`` must come from the key itself. With ``shown``
(:func:`previous_selection`), the two rows also see what the selection made at the cue's ``?`` keeps
(I_c's paragraphs, I_s's summaries), from the model's own votes, as under decoding: the pointer must then
hold with that extra context visible too.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from zoomr.summary_pointer import Cue


def cue_view_mask(
    length: int,
    response_starts: Sequence[int],
    cues: Sequence[Sequence[Cue]],
    window: int,
    shown: Sequence[Sequence[Sequence[tuple[int, int]]]] | None = None,
) -> torch.Tensor:
    """``[B, 1, T, T]`` bool (True = attend): causal, except that each cue's rows after ``?`` (its key, or topic
    and key: ``Cue.start`` to ``pos - 1``) and its boundary row (``pos``) see only the prompt (rows before
    ``response_starts[b]``), the last ``window`` rows and, with
    ``shown[b][n]``, the row ranges ``[lo, hi)`` given for cue ``n``."""
    if window < 0:
        raise ValueError(f"cue_view_mask: window must be >= 0, got {window}")
    B = len(response_starts)
    rows = torch.arange(length)
    mask = (rows[None, :] <= rows[:, None]).expand(B, 1, length, length).clone()
    for b in range(B):
        if not cues[b]:
            continue
        always = rows < response_starts[b]
        for n, cue in enumerate(cues[b]):
            seen = always.clone()
            for lo, hi in shown[b][n] if shown is not None else ():
                seen[lo:hi] = True
            for r in range(cue.start, cue.pos + 1):
                if 0 <= r < length:
                    mask[b, 0, r] &= seen | (rows >= r - window)
    return mask


def paragraph_rows(start: int, spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Each paragraph's regular rows R_i ``[lo, hi)``: from the response start or the row after the previous
    paragraph's break, up to its summary's begin delimiter (summary content ``[a, b)``, delimiters ``a - 1``, ``b``,
    the break at ``b + 1``)."""
    out, lo = [], start
    for a, b in spans:
        out.append((lo, a - 1))
        lo = b + 2
    return out


def previous_selection(qk, batch, top_k: int = 2, c: int = 2) -> list[list[list[tuple[int, int]]]]:
    """Per sequence and cue: the rows the selection made at the cue's ``?`` (the boundary before the key) keeps,
    from ``qk`` (a :func:`zoomr.summary_pointer.capture_qk` store of a forward of ``batch``): R_i of I_c and
    S_i with its delimiters of I_s, the paper's rule (:func:`zoomr.summary_pointer.selection_hits`)."""
    from zoomr.summary_pointer import selection_hits

    out = []
    for b, (spans, cues) in enumerate(zip(batch.spans, batch.cues)):
        regular = paragraph_rows(batch.starts[b], spans)
        marks = [Cue(cue.start - 1, cue.target, cue.far) for cue in cues]
        picks = selection_hits(qk, spans, marks, top_k, c, b=b) if cues and spans else []
        out.append([[regular[i] for i in s.zoomed] + [(spans[i][0] - 1, spans[i][1] + 1) for i in s.summarized]
                    for s in picks])  # fmt: skip
    return out


def batch_cue_view(batch, window: int, shown=None) -> torch.Tensor | None:
    """:func:`cue_view_mask` for a :class:`zoomr.testbed.curriculum.Batch`; None when it has no cues (copy and
    recall batches, traces without summaries): the plain causal forward."""
    if not batch.cues or not any(batch.cues) or batch.starts is None:
        return None
    mask = cue_view_mask(batch.input_ids.shape[1], batch.starts, batch.cues, window, shown)
    return mask.to(batch.input_ids.device)
