"""Summary augmentation against real HTTP servers on loopback: a fault-injecting FastAPI server (fast)
and ``transformers serve`` with the tiny model (tests/test_summarize_serve.py)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from data_prep.fake_llm_server import FakeServer, FaultPlan, fake_summary
from data_prep.llm_client import ChatClient, EndpointSettings, FatalRequestError, RequestFailed
from data_prep.summarize import (
    SummarizeFailed,
    SummarizeSettings,
    clean_summary,
    plan_rows,
    summarize_traces,
    summary_messages,
    summary_validator,
)
from data_prep.traces import TraceRow, load_trace_rows
from zoomr import tokens
from zoomr.schemas.checks import SettingsError
from zoomr.segments import split_paragraphs, split_thought

TRACES = "data_prep/data/traces/sky-t1-math-correct-5k-32b-ckpt140_aime24.jsonl"
B, E = tokens.BEGIN_SUMMARY, tokens.END_SUMMARY


def small_rows() -> list[TraceRow]:
    """Three short real traces (closed thoughts) plus messy rows: truncated, no thought, empty thought."""
    rows, _ = load_trace_rows(source="local", path=TRACES, format="skythought_eval")
    closed = sorted((r for r in rows if split_thought(r.response).closed), key=lambda r: len(r.response))[:3]
    truncated = next(r for r in rows if not split_thought(r.response).closed)
    messy = [
        truncated,
        TraceRow(id="nothought", question="q?", response="just an answer"),
        TraceRow(id="empty", question="q?", response=f"{tokens.BEGIN_THOUGHT}\n\n  \n{tokens.END_THOUGHT} x"),
    ]
    return closed + messy


def settings(url: str, concurrency: int = 4, **kw) -> SummarizeSettings:
    endpoint = EndpointSettings(
        base_url=url,
        model="fake-70b",
        api_key_env="ZOOMR_TEST_KEY",
        concurrency=concurrency,
        timeout_s=kw.pop("timeout_s", 2.0),
        max_retries=kw.pop("max_retries", 40),
        backoff_base_s=0.001,
        backoff_max_s=0.01,
        stall_timeout_s=kw.pop("stall_timeout_s", 600.0),
        **{"max_tokens": 32, **kw.pop("endpoint_overrides", {})},
    )
    return SummarizeSettings(
        endpoint=endpoint, min_paragraph_chars=kw.pop("min_chars", 300), progress=False, **kw
    )


def run_pipeline(tmp: Path, url: str, rows=None, **kw) -> tuple[dict, str]:
    stats = summarize_traces(rows or small_rows(), settings(url, **kw), tmp)
    return stats, (tmp / "summarized.jsonl").read_text()


def test_clean_run_inserts_a_summary_after_every_paragraph(tmp_path):
    rows = small_rows()
    with FakeServer() as server:
        stats, text = run_pipeline(tmp_path, server.base_url, rows=rows)
    records = [json.loads(line) for line in text.splitlines()]
    assert stats["rows_in"] == 6 and stats["rows_written"] == 3
    assert stats["rows_skipped"] == {"truncated_thought": 1, "no_thought": 1, "empty_thought": 1}
    assert stats["summaries_failed"] == 0 and stats["summaries_new"] == stats["unique_paragraphs"]
    for rec, row in zip(records, rows[:3]):
        assert rec["conversations"][0] == {"from": "user", "value": row.question}
        out = rec["conversations"][1]["value"]
        paras = split_paragraphs(split_thought(row.response).thought, 300)
        assert out.count(B) == out.count(E) == len(paras) == len(rec["summaries"])
        for p in paras:  # each paragraph is followed by its own summary
            assert f"{p.text}\n\n{B}{fake_summary(p.text)}{E}" in out
        # removing the summary blocks gives back the original response exactly
        stripped = out
        for s in rec["summaries"]:
            stripped = stripped.replace(f"\n\n{B}{s}{E}", "", 1)
        assert stripped == row.response
    assert stats["compression_ratio"] > 1 and stats["response_growth"] > 1
    assert (tmp_path / "dataset" / "dataset_info.json").exists()
    # the output loads back through the SFT loader (Bespoke schema), from JSONL and from the HF dataset dir
    for path in (tmp_path / "summarized.jsonl", tmp_path / "dataset"):
        loaded, report = load_trace_rows(source="local", path=str(path), format="bespoke")
        assert [r.response for r in loaded] == [r["conversations"][1]["value"] for r in records]


def test_faulty_server_gives_the_same_output_as_a_clean_one(tmp_path):
    monkey_key = "sk-test-SECRET-123"
    os.environ["ZOOMR_TEST_KEY"] = monkey_key
    try:
        with FakeServer(FaultPlan(expected_key=monkey_key)) as clean:
            clean_stats, clean_text = run_pipeline(tmp_path / "clean", clean.base_url, min_chars=100)
        plan = FaultPlan(
            error_rate=0.2, slow_rate=0.1, garbage_rate=0.1, empty_rate=0.08, special_rate=0.08,
            slow_s=0.6, seed=7, expected_key=monkey_key,
        )  # fmt: skip
        with FakeServer(plan) as faulty:
            stats, text = run_pipeline(
                tmp_path / "faulty", faulty.base_url, concurrency=8, timeout_s=0.3, min_chars=100
            )
            log = faulty.log
    finally:
        del os.environ["ZOOMR_TEST_KEY"]
    assert text == clean_text
    assert stats["summaries_failed"] == 0
    for outcome in ("error", "slow", "garbage", "empty", "special"):
        assert log.by_outcome.get(outcome, 0) > 0, outcome
    attempts = stats["attempts"]
    assert (
        attempts["timeout"] > 0
        and attempts["bad_json"] > 0
        and attempts["http_429"] + attempts["http_500"] > 0
    )
    assert attempts["rejected:empty"] > 0 and attempts["rejected:special_token"] > 0
    # the key was sent on every request, and appears in no output file
    assert set(log.auth_headers) == {f"Bearer {monkey_key}"}
    for f in (tmp_path / "faulty").rglob("*"):
        if f.is_file():
            assert monkey_key.encode() not in f.read_bytes(), f


def test_rerun_asks_only_for_what_is_missing(tmp_path):
    rows = small_rows()
    with FakeServer() as server:
        first, text1 = run_pipeline(tmp_path, server.base_url, rows=rows[:2])
        n1 = server.log.requests
        second, text2 = run_pipeline(tmp_path, server.base_url, rows=rows)
        n2 = server.log.requests - n1
        third, _ = run_pipeline(tmp_path, server.base_url, rows=rows)
    assert first["summaries_requested"] == n1 > 0
    assert second["summaries_cached"] == first["unique_paragraphs"]
    assert n2 == second["summaries_requested"] == second["unique_paragraphs"] - first["unique_paragraphs"]
    assert third["summaries_requested"] == 0 and server.log.requests == n1 + n2
    assert text2.startswith(text1)


def test_killed_run_loses_nothing(tmp_path):
    """SIGKILL a pipeline process mid-run; the rerun requests exactly the summaries not yet stored."""
    rows = small_rows()
    plan = FaultPlan(latency_s=0.05)
    with FakeServer(plan) as server:
        script = textwrap.dedent(
            f"""
            import sys; sys.path.insert(0, {str(Path.cwd())!r})
            from tests.test_summarize import settings, small_rows
            from data_prep.summarize import summarize_traces
            summarize_traces(small_rows(), settings({server.base_url!r}, concurrency=2), {str(tmp_path)!r})
            """
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(Path.cwd())}
        )
        db = tmp_path / "store.sqlite"
        deadline = time.time() + 60
        stored = 0
        while time.time() < deadline and proc.poll() is None:
            if db.exists():
                try:
                    stored = sqlite3.connect(str(db)).execute("SELECT COUNT(*) FROM summaries").fetchone()[0]
                except sqlite3.OperationalError:
                    stored = 0
                if stored >= 5:
                    break
            time.sleep(0.02)
        assert proc.poll() is None, "pipeline finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        stored = sqlite3.connect(str(db)).execute("SELECT COUNT(*) FROM summaries").fetchone()[0]
        before = server.log.requests
        stats, text = run_pipeline(tmp_path, server.base_url, rows=rows)
        asked = server.log.requests - before
    assert stored >= 5
    assert stats["summaries_cached"] == stored
    assert asked == stats["summaries_requested"] == stats["unique_paragraphs"] - stored
    with FakeServer() as clean:
        _, clean_text = run_pipeline(tmp_path / "clean", clean.base_url, rows=rows)
    assert text == clean_text


def test_a_rerun_writing_no_row_leaves_no_earlier_dataset_behind(tmp_path):
    """A rerun into the same out_dir whose rows all were skipped wrote an empty summarized.jsonl and stats saying 0
    rows, but left the earlier run's dataset/ (its rows, loadable as this run's output); now dataset/ goes too."""
    rows = small_rows()
    with FakeServer() as server:
        first, _ = run_pipeline(tmp_path, server.base_url, rows=rows[:1])
        assert (tmp_path / "dataset").is_dir()
        second, text = run_pipeline(tmp_path, server.base_url, rows=rows[3:])  # truncated, no thought, empty
    assert first["rows_written"] == 1 and second["rows_written"] == 0 and text == ""
    assert not (tmp_path / "dataset").exists()


def test_fatal_http_errors_stop_at_once(tmp_path):
    os.environ.pop("ZOOMR_TEST_KEY", None)
    with (
        FakeServer(FaultPlan(expected_key="right-key")) as server,
        pytest.raises(SummarizeFailed, match="HTTP 401") as e,
    ):
        run_pipeline(tmp_path, server.base_url)
    assert server.log.requests <= 4  # at most one per worker, no retries
    assert isinstance(e.value.__context__, FatalRequestError) or "HTTP 401" in str(e.value)
    assert json.loads((tmp_path / "stats.json").read_text())["fatal_error"].count("HTTP 401") == 1  # port-proof: the URL may hold "401"


async def _complete(url: str, **kw):
    s = EndpointSettings(base_url=url, model="m", api_key_env=None, backoff_base_s=0.001, **kw)
    async with ChatClient(s) as c:
        return await c.complete(summary_messages("P", "para"), summary_validator(True)), c.stats


def test_client_gives_up_after_max_retries():
    import asyncio

    with FakeServer(FaultPlan(error_rate=1.0)) as server, pytest.raises(RequestFailed, match="3 attempts"):
        asyncio.run(_complete(server.base_url, max_retries=2))
    assert server.log.requests == 3


def test_validation_and_cleaning():
    v = summary_validator(reject_truncated=True)
    assert v("", "stop") == "empty" and v("Summary:  ", "stop") == "empty"
    assert v("x <|eot_id|>", "stop") == "special_token" and v(f"a {B} b", "stop") == "special_token"
    assert v("fine", "length") == "truncated" and summary_validator(False)("fine", "length") is None
    assert clean_summary("  **Summary:** We find\n x = 3. ") == "We find x = 3."
    with pytest.raises(ValueError):
        EndpointSettings(base_url="localhost:8000")
    for field, bad in (("temperature", -1.0), ("max_tokens", 0), ("backoff_base_s", -1.0), ("timeout_s", float("nan"))):
        with pytest.raises(ValueError, match=f"pipeline.endpoint.{field}="):  # temperature=-1 went to the server
            EndpointSettings(**{field: bad})


def test_extra_body_cannot_replace_what_the_client_sends(tmp_path):
    """extra_body={"stream": true} made the server stream, and every attempt was read as bad JSON until the run gave
    up; extra_body={"max_tokens": 512} replaced max_tokens behind the store's record and the length check. Refused."""
    for extra in ({"stream": True}, {"max_tokens": 512, "top_p": 0.9}, {"model": "other"}):
        with pytest.raises(ValueError, match=f"pipeline.endpoint.extra_body sets {next(iter(extra))}, which"):
            EndpointSettings(extra_body=extra)
    assert EndpointSettings(extra_body={"top_p": 0.9, "min_tokens": 4}).extra_body["top_p"] == 0.9


def test_a_store_path_holding_another_file_is_named(tmp_path):
    """``pipeline.store=<a file that is not SQLite>`` ended in a sqlite3.DatabaseError traceback; then it was refused
    only when the store was opened, after the run directory was written (the check made before it let it pass)."""
    from data_prep.summary_store import SummaryStore, check_request_settings
    from zoomr.jsonl import BadRowError

    (tmp_path / "notes.txt").write_text("not a database, and long enough for sqlite to read a header " * 4)
    with pytest.raises(BadRowError, match="notes.txt: not a summary store .*give pipeline.store another path"):
        SummaryStore(tmp_path / "notes.txt", "m", "v1")
    with pytest.raises(BadRowError, match="notes.txt: not a summary store"):  # before the run directory: it passed
        check_request_settings(tmp_path / "notes.txt", "m", "v1", {"max_tokens": 32})
    with SummaryStore(tmp_path / "store.sqlite", "m", "v1") as store:  # a new path is created
        assert store.get("k") is None


def test_another_programs_sqlite_file_is_not_taken_for_a_store(tmp_path):
    """A SQLite file whose ``summaries`` table has other columns was opened as a store (WAL mode and the settings
    table written into it) and the run ended in sqlite's 'no such column' traceback; now it is refused by name, before
    the run directory by the early check, and left as it was."""
    from data_prep.summary_store import check_request_settings
    from zoomr.jsonl import BadRowError

    path = tmp_path / "store.sqlite"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE summaries (id INTEGER, text TEXT)")
    before = path.read_bytes()
    with pytest.raises(BadRowError, match="store.sqlite: not a summary store .*table summaries has no column "
                                          "paragraph_hash, model,"):  # fmt: skip
        check_request_settings(path, "fake-70b", "v1", {"max_tokens": 32})
    with pytest.raises(BadRowError, match="store.sqlite: not a summary store .*table summaries has no column"):
        run_pipeline(tmp_path, "http://127.0.0.1:9/v1", rows=small_rows()[:1])
    assert path.read_bytes() == before and not (tmp_path / "store.sqlite-wal").exists()


def test_a_store_whose_settings_record_is_not_an_object_is_named(tmp_path):
    """A request settings record that is not a JSON object (a store edited by hand, a torn copy) was a JSONDecodeError
    or AttributeError traceback from the check made before the run; now the store is named."""
    from data_prep.summary_store import SummaryStore, check_request_settings
    from zoomr.jsonl import BadRowError

    path = tmp_path / "store.sqlite"
    SummaryStore(path, "m", "v1", request_settings={"max_tokens": 32}).close()
    for record in ("not json", "[32]"):
        with sqlite3.connect(path) as db:
            db.execute("UPDATE request_settings SET settings=?", (record,))
        with pytest.raises(BadRowError, match=r"store.sqlite: not a summary store \(its request settings for m are"):
            check_request_settings(path, "m", "v1", {"max_tokens": 32})


def test_a_store_path_no_store_can_be_at_is_refused_before_the_run(tmp_path):
    """``pipeline.store=<a directory>`` (or a path under a file) ended in sqlite's 'unable to open database file'
    traceback when the store was opened, after the run directory was written; now the check made before it refuses
    the path by name, and so does the store itself."""
    from data_prep.summary_store import SummaryStore, check_request_settings
    from zoomr.paths import MissingInput

    (tmp_path / "a_file").write_text("x")
    for path, why in ((tmp_path, "is a directory"), (tmp_path / "a_file" / "store.sqlite", "a_file is a file")):
        with pytest.raises(MissingInput, match=f"summary store {path}.*{why}"):
            check_request_settings(path, "m", "v1", {"max_tokens": 32})
        with pytest.raises(MissingInput, match=f"summary store {path}.*{why}"):
            SummaryStore(path, "m", "v1")


def test_a_stored_summary_this_run_rejects_is_asked_for_again(tmp_path):
    """Summaries cut by max_tokens, stored by a run with reject_truncated_answers=false, were reused as good ones by
    a rerun that rejects them (0 requested, the cut summaries written); now they are asked for again and replaced."""
    rows = small_rows()[:1]
    with FakeServer() as server:
        first, _ = run_pipeline(tmp_path, server.base_url, rows=rows, reject_truncated_answers=False)
        with sqlite3.connect(tmp_path / "store.sqlite") as db:  # as a server that cut every answer stores them
            db.execute("UPDATE summaries SET finish_reason='length', summary='cut'")
        kept, text = run_pipeline(tmp_path, server.base_url, rows=rows, reject_truncated_answers=False)
        assert kept["summaries_requested"] == 0 and "cut" in json.loads(text)["summaries"]
        second, text = run_pipeline(tmp_path, server.base_url, rows=rows)
    assert first["summaries_new"] > 0 and second["summaries_cached"] == 0
    assert second["summaries_requested"] == second["summaries_new"] == first["summaries_new"]
    assert "cut" not in json.loads(text)["summaries"]
    with sqlite3.connect(tmp_path / "store.sqlite") as db:  # replaced, not stored twice
        assert db.execute("SELECT COUNT(*), SUM(finish_reason='length') FROM summaries").fetchone() == (
            first["summaries_new"], 0)


def test_a_store_is_reused_only_under_the_request_settings_its_summaries_were_asked_for_under(tmp_path):
    """A rerun with another max_tokens (or temperature, seed, extra_body) reused every stored summary without a word
    (the store is keyed by paragraph, model and prompt): refused now, naming the field, before a request is sent;
    the same settings reuse them, and a store made before the record existed records the settings it is run with."""
    rows = small_rows()[:1]
    with FakeServer() as server:
        first, _ = run_pipeline(tmp_path, server.base_url, rows=rows)
        with pytest.raises(SettingsError, match=r"pipeline.endpoint.max_tokens: was 32, now 256"):
            run_pipeline(tmp_path, server.base_url, rows=rows, endpoint_overrides={"max_tokens": 256})
        again, _ = run_pipeline(tmp_path, server.base_url, rows=rows)
        with sqlite3.connect(tmp_path / "store.sqlite") as db:  # as a store written before the record
            db.execute("DROP TABLE request_settings")
        older, _ = run_pipeline(tmp_path, server.base_url, rows=rows, endpoint_overrides={"temperature": 0.7})
        with pytest.raises(SettingsError, match=r"pipeline.endpoint.temperature: was 0.7, now 0.0"):
            run_pipeline(tmp_path, server.base_url, rows=rows)
    assert first["summaries_new"] > 0 and again["summaries_cached"] == first["summaries_new"]
    assert again["summaries_requested"] == 0 and older["summaries_requested"] == 0


def test_plan_counts_messy_rows():
    rows = small_rows()
    planned, skipped = plan_rows(rows, SummarizeSettings(keep_truncated=True))
    assert len(planned) == 4 and skipped == {"no_thought": 1, "empty_thought": 1}
    already = TraceRow(id="x", question="q", response=f"{tokens.BEGIN_THOUGHT}a{B}s{E}{tokens.END_THOUGHT}")
    assert plan_rows([already], SummarizeSettings())[1] == {"already_summarized": 1}


def test_token_counts_are_taken_a_few_texts_at_a_time(monkeypatch):
    """The stats count tokens in batches of COUNT_BATCH texts: every response in one tokenizer call held all their
    encodings at once (2 GB for 1,000 traces of 4,000 tokens). The counts are those of one call over all texts."""
    from data_prep import summarize

    calls = []

    def tokenizer(texts, add_special_tokens=True):
        calls.append(len(texts))
        return {"input_ids": [t.split() for t in texts]}

    records = [{"paragraphs": ["a b c", "d e"], "summaries": ["x", "y z"], "conversations": [{}, {"value": "a b " * i}]}
               for i in range(1, 6)]  # fmt: skip
    originals = ["a " * i for i in range(1, 6)]
    monkeypatch.setattr(summarize, "COUNT_BATCH", 3, raising=False)
    stats = summarize.length_stats(records, originals, tokenizer)
    assert calls and max(calls) <= 3 and sum(calls) == 10 + 10 + 5 + 5
    assert stats["paragraphs"] == 10 and stats["mean_paragraph_tokens"] == 2.5 and stats["mean_summary_tokens"] == 1.5
    assert stats["response_growth"] == 2 * 15 / 15 and stats["compression_ratio"] == 25 / 15


def test_entry_point(tmp_path):
    """``python -m data_prep +pipeline=summarize +data=traces`` end to end against the fake server."""
    with FakeServer() as server:
        proc = subprocess.run(
            [
                sys.executable, "-m", "data_prep", "+pipeline=summarize", "+data=traces",
                f"pipeline.endpoint.base_url={server.base_url}", "pipeline.max_rows=2",
                "pipeline.endpoint.concurrency=4", f"pipeline.out_dir={tmp_path / 'out'}",
                f"hydra.run.dir={tmp_path / 'run'}", "logger.mode=disabled",
            ],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "summaries: 1/2 rows written" in proc.stdout  # the vendored trace #2 is truncated
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["summaries_failed"] == 0 and summary["unit"] == "tokens"
    assert summary["compression_ratio"] > 1
    assert len((tmp_path / "out" / "summarized.jsonl").read_text().splitlines()) == 1
    assert "HTTP Request" not in proc.stderr  # per-request logging is silenced


def test_a_summary_longer_than_max_tokens_is_asked_for_again_though_reported_finished(tmp_path):
    """A server that ignores max_tokens answered summaries longer than it with finish_reason "stop" (by its own
    usage.completion_tokens), and they were written as good ones; only a "length" answer was rejected. Now both are
    rejected under reject_truncated_answers (asked again, and not reused from the store), both kept without it."""
    rows = small_rows()[:1]
    with FakeServer(FaultPlan(overlong_rate=0.5, seed=1)) as server:
        stats, text = run_pipeline(tmp_path / "a", server.base_url, rows=rows)
        assert server.log.by_outcome["overlong"] > 0
    assert stats["attempts"]["rejected:too_long"] == server.log.by_outcome["overlong"]
    assert stats["summaries_failed"] == 0
    assert all(s == fake_summary(p) for s, p in zip(*(json.loads(text)[k] for k in ("summaries", "paragraphs"))))
    with FakeServer(FaultPlan(overlong_rate=1.0)) as server:  # kept without the check, not reused with it
        kept, text = run_pipeline(tmp_path / "b", server.base_url, rows=rows, reject_truncated_answers=False)
        assert "and so on" in json.loads(text)["summaries"][0]
    with FakeServer() as server:
        again, text = run_pipeline(tmp_path / "b", server.base_url, rows=rows)
    assert again["summaries_cached"] == 0 and again["summaries_new"] == kept["summaries_new"] > 0
    assert "and so on" not in text


def test_outputs_cut_short_leave_no_new_rows_beside_an_earlier_dataset(tmp_path, monkeypatch):
    """summarized.jsonl was replaced first and dataset/ written in place after it: a kill in between left this run's
    rows beside the earlier run's dataset/, which training would load (data.path=<out>/dataset)."""
    import datasets

    from data_prep.summarize import write_outputs

    write_outputs(tmp_path, [{"id": "old"}], {"rows": 1})
    before = {p: (tmp_path / p).read_bytes() for p in ("summarized.jsonl", "stats.json")}

    def killed(self, path, *args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(datasets.Dataset, "save_to_disk", killed)
        with pytest.raises(KeyboardInterrupt):
            write_outputs(tmp_path, [{"id": "new"}], {"rows": 1})
    assert {p: (tmp_path / p).read_bytes() for p in before} == before
    assert datasets.load_from_disk(str(tmp_path / "dataset"))["id"] == ["old"]
    write_outputs(tmp_path, [{"id": "new"}], {"rows": 1})  # the rerun, over what the killed one left
    assert datasets.load_from_disk(str(tmp_path / "dataset"))["id"] == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset", "stats.json", "summarized.jsonl"]
