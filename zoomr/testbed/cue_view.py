"""ZoomR's view at the cue, in the training forward: where the lookup must happen (issue 13).

During ZoomR decoding (:class:`zoomr.cache.zoomr.ZoomRCache`) the rows of a cue ``? k :`` are computed
under the selection made at the *previous* boundary: they see the prompt, the summaries, the recent window
and whatever was zoomed in before, not the paragraph that defines ``k`` (unless it is recent). The
selection at ``:`` applies from the next row (``=``) on. A model trained with full attention learns to
fetch the value at the key token (measured teacher-forced on the validation seed: the ``=`` row restricted
to ZoomR's view answers 1.000, but with the key and ``:`` rows also blind to the paragraph 0.029), so the
selection comes one step too late. This mask gives the training forward the decoding-time view at those
two rows, so the value can only be read at ``=``, where the zoomed-in paragraph is visible.

Conservative: the previously zoomed paragraphs (visible at decoding) are hidden too, and the window is
counted back from each row (at decoding it is counted from the previous boundary, which is earlier).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from zoomr.summary_pointer import Cue


def cue_view_mask(
    length: int,
    response_starts: Sequence[int],
    spans: Sequence[Sequence[tuple[int, int]]],
    cues: Sequence[Sequence[Cue]],
    window: int,
) -> torch.Tensor:
    """``[B, 1, T, T]`` bool (True = attend): causal, except that each cue's key row (``pos - 1``) and boundary
    row (``pos``) see only the prompt (rows before ``response_starts[b]``), every summary with its delimiters
    (content rows ``[a, b)`` of ``spans``, delimiters at ``a - 1`` and ``b``) and the last ``window`` rows."""
    if window < 0:
        raise ValueError(f"cue_view_mask: window must be >= 0, got {window}")
    B = len(response_starts)
    rows = torch.arange(length)
    mask = (rows[None, :] <= rows[:, None]).expand(B, 1, length, length).clone()
    for b in range(B):
        if not cues[b]:
            continue
        always = rows < response_starts[b]
        for a, e in spans[b]:
            always[max(0, a - 1) : e + 1] = True
        for cue in cues[b]:
            for r in (cue.pos - 1, cue.pos):
                if 0 <= r < length:
                    mask[b, 0, r] &= always | (rows >= r - window)
    return mask


def batch_cue_view(batch, window: int) -> torch.Tensor | None:
    """:func:`cue_view_mask` for a :class:`zoomr.testbed.curriculum.Batch`; None when it has no cues (copy and
    recall batches, traces without summaries): the plain causal forward."""
    if not batch.cues or not any(batch.cues) or batch.starts is None:
        return None
    return cue_view_mask(batch.input_ids.shape[1], batch.starts, batch.spans, batch.cues, window).to(batch.input_ids.device)
