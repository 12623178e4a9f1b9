"""ZoomR's theoretical memory saving (ZoomR paper §3.5).

The resident (device) KV of ZoomR is |I_f| rows: the prompt, the recent window, c zoomed regular
segments of mean length L̄_R and (|I_all| − c) voted summaries of mean length L̄_S. A full cache holds
N_p + N_g rows at the last step, so

    MS = (N_p + N_g) / (N_p + c·L̄_R + (|I_all| − c)·L̄_S + N_w).

|I_all| is bounded by the number of summaries generated so far, which grows with N_g: the paper's
second example (N_g = 32K → ≈ 7.11×) only holds if |I_all| doubles with N_g (80 → 160); with |I_all|
fixed at 80 the formula gives 10.8×. :func:`memory_saving_at` makes that scaling explicit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ZoomRFootprint:
    """Inputs of the MS formula (token counts; one row = one token's K and V at one layer/head)."""

    n_prompt: int  # N_p
    n_generated: int  # N_g
    n_window: int  # N_w
    consensus: int  # c
    mean_regular_len: float  # L̄_R
    mean_summary_len: float  # L̄_S
    n_selected: int  # |I_all|

    def __post_init__(self) -> None:
        if min(self.n_prompt, self.n_generated, self.n_window, self.consensus) < 0:
            raise ValueError("token counts must be >= 0")
        lengths = {"mean_regular_len": self.mean_regular_len, "mean_summary_len": self.mean_summary_len}
        if bad := [f"{k}={v!r}" for k, v in lengths.items() if not (isinstance(v, int | float) and 0 <= v < math.inf)]:
            raise ValueError(f"{', '.join(bad)}: mean lengths must be finite numbers >= 0")  # MS came out NaN or off
        if self.n_selected < self.consensus:
            raise ValueError(f"|I_all| = {self.n_selected} < c = {self.consensus}: I_c is a subset of I_all")

    @property
    def full_rows(self) -> int:
        return self.n_prompt + self.n_generated

    @property
    def resident_rows(self) -> float:
        """|I_f| in the paper's accounting (segments assumed disjoint from the window)."""
        return (
            self.n_prompt
            + self.consensus * self.mean_regular_len
            + (self.n_selected - self.consensus) * self.mean_summary_len
            + self.n_window
        )


def memory_saving(fp: ZoomRFootprint) -> float:
    """MS = full rows / ZoomR resident rows (paper §3.5)."""
    if fp.resident_rows <= 0:  # a ZeroDivisionError before
        raise ValueError(f"{fp}: ZoomR holds no rows (no prompt, window, zoomed segments or summaries): MS is undefined")
    return fp.full_rows / fp.resident_rows


def memory_saving_at(base: ZoomRFootprint, n_generated: int) -> float:
    """MS at another generation length, with |I_all| scaled in proportion to N_g.

    The number of summaries grows linearly with the generated length, so the worst-case |I_all|
    does too (paper §3.5: "the denominator grows sub-linearly ... as the number of summaries increases").
    """
    if base.n_generated <= 0:  # a ZeroDivisionError before
        raise ValueError("memory_saving_at: the base footprint generated no tokens, |I_all| per token is undefined")
    scaled = round(base.n_selected * n_generated / base.n_generated)
    return memory_saving(
        ZoomRFootprint(
            n_prompt=base.n_prompt,
            n_generated=n_generated,
            n_window=base.n_window,
            consensus=base.consensus,
            mean_regular_len=base.mean_regular_len,
            mean_summary_len=base.mean_summary_len,
            n_selected=max(scaled, base.consensus),
        )
    )


PAPER_EXAMPLE = ZoomRFootprint(
    n_prompt=512,
    n_generated=16384,
    n_window=512,
    consensus=2,
    mean_regular_len=250,
    mean_summary_len=20,
    n_selected=80,
)
