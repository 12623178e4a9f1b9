"""The summarise run's summary says why rows were dropped (issue 19.7: 11 of 30 vendored traces are cut before
<|end_of_thought|> and ``keep_truncated=false`` dropped them without a word in the summary)."""

from __future__ import annotations

from data_prep.summarize import SummarizeSettings, describe_skipped, plan_rows
from data_prep.traces import TraceRow
from zoomr import tokens


def test_skipped_rows_are_explained_with_the_setting_that_keeps_them():
    para = "x" * 500
    closed = f"{tokens.BEGIN_THOUGHT}{para}\n\n{para}{tokens.END_THOUGHT}"
    rows = [TraceRow("1", "q1", closed), TraceRow("2", "q2", f"{tokens.BEGIN_THOUGHT}{para}\n\n{para}"),
            TraceRow("3", "q3", "no")]
    planned, skipped = plan_rows(rows, SummarizeSettings())
    assert len(planned) == 1 and dict(skipped) == {"truncated_thought": 1, "no_thought": 1}
    line = describe_skipped(dict(skipped))
    assert "1 trace cut before <|end_of_thought|>; keep them with pipeline.keep_truncated=true" in line
    assert "1 no <|begin_of_thought|> section" in line and describe_skipped({}) == "none"
