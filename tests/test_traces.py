"""The trace loader keeps messy real rows, counts their defects, and never crashes on a bad line."""

from __future__ import annotations

import json
import re

import pytest

from data_prep.traces import load_trace_rows, sft_dataset
from zoomr.jsonl import BadRowError
from zoomr.paths import MissingInput


def test_vendored_traces_load_with_defects_counted():
    rows, report = load_trace_rows(path="data_prep/data/traces/sky-t1-math-correct-5k-32b-ckpt140_aime24.jsonl")
    assert report.rows == report.kept == len(rows) == 30
    truncated = [r for r in rows if "missing_end_thought" in r.defects]
    assert report.defects["missing_end_thought"] == len(truncated) > 0
    assert all(r.response.startswith("<|begin_of_thought|>") for r in rows)


def test_malformed_rows_are_counted_not_fatal(tmp_path):
    p = tmp_path / "t.jsonl"
    good = {"system": "sys", "conversations": [{"from": "user", "value": "Q"}, {"from": "assistant", "value": "A"}]}
    lines = [json.dumps(good), "{not json", json.dumps({"conversations": []}),
             json.dumps({"conversations": [{"from": "user", "value": ""}, {"from": "assistant", "value": "A"}]})]
    p.write_text("\n".join(lines) + "\n")
    rows, report = load_trace_rows(path=str(p), format="bespoke")
    assert len(rows) == 1 and rows[0].messages()[0] == {"role": "system", "content": "sys"}
    assert report.defects["malformed_json"] == 1
    assert report.defects["no_conversations"] == 1
    assert report.defects["no_question"] == 1


def test_a_row_with_a_lone_surrogate_is_counted_and_skipped(tmp_path):
    """JSON may escape a lone surrogate ("\\ud800"): such a row was kept, and the summariser ended in a
    UnicodeEncodeError traceback hashing its paragraphs (after the run directory was written); now it is a defect."""
    p = tmp_path / "t.jsonl"
    good = {"question": "Q", "code": ["<|begin_of_thought|>\n\nA\n\n<|end_of_thought|>"]}
    p.write_text(json.dumps(good) + "\n" + json.dumps({**good, "question": "Q\ud800"}) + "\n"
                 + json.dumps({**good, "code": ["A\udc80"]}) + "\n")  # fmt: skip
    rows, report = load_trace_rows(path=str(p))
    assert [r.question for r in rows] == ["Q"] and report.defects["lone_surrogate"] == 2


def test_a_bespoke_row_whose_system_is_not_text_is_counted_and_skipped(tmp_path):
    """``"system": 5`` (or a list) was kept and went into the chat as a message's content (and into the summariser's
    output rows, where a number among texts failed the dataset's write); now it is a defect like a missing question."""
    p = tmp_path / "t.jsonl"
    good = {"system": "sys", "conversations": [{"from": "user", "value": "Q"}, {"from": "assistant", "value": "A"}]}
    p.write_text("\n".join(json.dumps({**good, "system": s}) for s in ("sys", None, 5, ["sys"])) + "\n")
    rows, report = load_trace_rows(path=str(p), format="bespoke")
    assert [r.system for r in rows] == ["sys", None] and report.defects["system_not_text"] == 2


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="trace file not found"):
        load_trace_rows(path=str(tmp_path / "missing.jsonl"))
    with pytest.raises(ValueError, match="data.format"):
        load_trace_rows(path="x", format="csv")
    (tmp_path / "empty.jsonl").write_text("{bad\n")
    with pytest.raises(MissingInput, match=rf"{tmp_path / 'empty.jsonl'}: no usable trace rows in format 'skythought_eval'"):
        load_trace_rows(path=str(tmp_path / "empty.jsonl"))  # named: the trainer prints it without a traceback


def test_a_hub_dataset_out_of_reach_is_a_missing_input_naming_the_local_alternative(monkeypatch):
    """``data=bespoke_stratos`` offline was datasets' ConnectionError under a traceback."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("datasets.config.HF_HUB_OFFLINE", True)
    with pytest.raises(MissingInput, match=r"data.hub_id=nobody/no-such-traces \(split train\): could not load it "
                                           r"from the Hugging Face hub .*use data.source=local"):  # fmt: skip
        load_trace_rows(source="hub", hub_id="nobody/no-such-traces", format="bespoke")


def test_sft_dataset_is_chat_messages():
    ds = sft_dataset({"source": "local", "path": "data_prep/data/traces/sky-t1-math-correct-5k-32b-ckpt140_aime24.jsonl",
                      "max_samples": 3})
    assert len(ds) == 3
    assert [m["role"] for m in ds[0]["messages"]] == ["user", "assistant"]


@pytest.mark.parametrize(("name", "message"), [
    ("rows.parquet", "not a parquet file (ArrowInvalid"),
    ("a_directory", "not a directory written with datasets' save_to_disk (FileNotFoundError"),
])  # fmt: skip
def test_a_local_path_that_is_no_dataset_is_named(name, message, tmp_path):
    """A torn parquet file or a directory without a saved dataset was pyarrow's / datasets' traceback in every
    trainer and the summarise pipeline; now a BadRowError (printed alone) naming data.path."""
    path = tmp_path / name
    if name.endswith(".parquet"):
        path.write_text("not parquet")
    else:
        path.mkdir()
    with pytest.raises(BadRowError, match=re.escape(f"data.path={path}: {message}")):
        load_trace_rows(source="local", path=str(path))
