"""The paper's memory-saving formula (ZoomR §3.5) reproduces its two worked examples."""

from __future__ import annotations

import dataclasses

import pytest

from zoomr.memory_model import PAPER_EXAMPLE, ZoomRFootprint, memory_saving, memory_saving_at


def test_paper_example_16k():
    assert memory_saving(PAPER_EXAMPLE) == pytest.approx(5.48, abs=0.005)
    assert PAPER_EXAMPLE.resident_rows == 512 + 2 * 250 + 78 * 20 + 512


def test_paper_example_32k_scales_summaries_with_length():
    assert memory_saving_at(PAPER_EXAMPLE, 32768) == pytest.approx(7.11, abs=0.005)
    # with |I_all| held at 80 the formula would give ~10.8x, not the paper's 7.11x
    fixed = dataclasses.replace(PAPER_EXAMPLE, n_generated=32768)
    assert memory_saving(fixed) == pytest.approx(10.79, abs=0.01)


def test_saving_grows_with_length_and_shrinks_with_c():
    assert memory_saving_at(PAPER_EXAMPLE, 8192) < memory_saving(PAPER_EXAMPLE)
    more_zoom = dataclasses.replace(PAPER_EXAMPLE, consensus=4)
    assert memory_saving(more_zoom) < memory_saving(PAPER_EXAMPLE)


def test_rejects_inconsistent_inputs():
    with pytest.raises(ValueError, match="subset"):
        ZoomRFootprint(512, 1024, 512, consensus=3, mean_regular_len=250, mean_summary_len=20, n_selected=2)
    with pytest.raises(ValueError):
        ZoomRFootprint(-1, 1024, 512, consensus=2, mean_regular_len=250, mean_summary_len=20, n_selected=2)


def test_rejects_lengths_and_footprints_the_formula_cannot_use():
    """A NaN or negative mean length gave a NaN or meaningless MS without a word; a footprint holding no rows, or a
    base that generated nothing, was a ZeroDivisionError."""
    for field in ("mean_regular_len", "mean_summary_len"):
        for bad in (float("nan"), -50.0, float("inf")):
            with pytest.raises(ValueError, match=f"{field}=.*: mean lengths must be finite numbers >= 0"):
                dataclasses.replace(PAPER_EXAMPLE, **{field: bad})
    with pytest.raises(ValueError, match="ZoomR holds no rows"):
        memory_saving(ZoomRFootprint(0, 0, 0, 0, 0, 0, 0))
    with pytest.raises(ValueError, match="the base footprint generated no tokens"):
        memory_saving_at(dataclasses.replace(PAPER_EXAMPLE, n_generated=0), 1024)
