"""Issue 18 defect 5 and 8: the summariser against a dead port, an always-failing and a hanging server (the
project's real loopback server): a clear failure naming the endpoint and the counts, fast on a dead port,
bounded on a hanging one; nothing finished is lost; a relative out_dir lands in the working directory."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_summarize import run_pipeline, small_rows

from data_prep.fake_llm_server import FakeServer, FaultPlan, free_port
from data_prep.summarize import SummarizeFailed
from data_prep.summary_store import SummaryStore
from zoomr.paths import REPO_ROOT


def test_dead_port_fails_at_once_naming_the_endpoint(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    t0 = time.monotonic()
    with pytest.raises(SummarizeFailed, match=r"cannot connect") as e:
        run_pipeline(tmp_path, url, max_retries=8)
    assert time.monotonic() - t0 < 5  # no backoff: nothing listens there
    assert url in str(e.value) and "0 of" in str(e.value) and "connect: " in str(e.value)
    assert e.value.stats["summaries_new"] == 0 and (tmp_path / "stats.json").exists()


def test_always_failing_server_stops_after_the_stall_timeout(tmp_path):
    with FakeServer(FaultPlan(error_rate=1.0)) as server:
        t0 = time.monotonic()
        with pytest.raises(SummarizeFailed, match="no answer accepted") as e:
            run_pipeline(tmp_path, server.base_url, max_retries=1000, stall_timeout_s=1.5)
        seconds = time.monotonic() - t0
    assert seconds < 1.5 + 3
    message = str(e.value)
    assert server.base_url in message and "http_500: " in message and "http_429: " in message


def test_hanging_server_is_bounded(tmp_path):
    with FakeServer(FaultPlan(slow_rate=1.0, slow_s=30)) as server:
        t0 = time.monotonic()
        with pytest.raises(SummarizeFailed, match="no answer accepted") as e:
            run_pipeline(tmp_path, server.base_url, timeout_s=0.5, max_retries=1000, stall_timeout_s=1.0)
        seconds = time.monotonic() - t0
    assert seconds < 1.0 + 0.5 + 3  # stall timeout + one request timeout + slack
    assert "timeout: " in str(e.value)


def test_partial_failures_keep_what_finished_and_succeed(tmp_path):
    """Some summaries failing is not a failed run: they are counted, the rest is written and stored."""
    with FakeServer(FaultPlan(error_rate=0.5, seed=3)) as server:
        stats, _ = run_pipeline(tmp_path, server.base_url, max_retries=0)
    assert 0 < stats["summaries_failed"] < stats["summaries_requested"]
    with SummaryStore(tmp_path / "store.sqlite", "fake-70b", stats["prompt_version"]) as store:
        assert len(store) == stats["summaries_new"]


def test_entry_point_exits_non_zero_on_a_dead_endpoint_and_writes_relative_out_dir_in_cwd(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/v1"
    proc = subprocess.run(
        [sys.executable, "-m", "data_prep", "+pipeline=summarize", "+data=traces", f"data.path={REPO_ROOT}/"
         "data_prep/data/traces/sky-t1-math-correct-5k-32b-ckpt140_aime24.jsonl",
         f"pipeline.endpoint.base_url='{url}'", "pipeline.max_rows=2", "pipeline.count_tokens=false",
         "pipeline.out_dir=rel_out", f"hydra.run.dir={tmp_path / 'run'}", "logger.mode=disabled"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},  # this checkout's code, run from another directory
    )  # fmt: skip
    assert proc.returncode != 0
    assert f"{url}: cannot connect" in proc.stderr and "0 of" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert json.loads((tmp_path / "rel_out" / "stats.json").read_text())["summaries_new"] == 0
    assert not (REPO_ROOT / "rel_out").exists()


def test_an_input_without_usable_rows_is_refused_before_the_run_directory(tmp_path):
    """An empty (or wholly malformed) trace file was refused only after ``config.json`` was written to the run
    directory, so the refused run left a directory behind; now nothing is written and nothing is asked."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    proc = subprocess.run(
        [sys.executable, "-m", "data_prep", "+pipeline=summarize", f"data.path={empty}",
         f"pipeline.endpoint.base_url=http://127.0.0.1:{free_port()}/v1", f"pipeline.out_dir={tmp_path / 'out'}",
         f"hydra.run.dir={tmp_path / 'run'}", "logger=none"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-1500:]
    assert f"{empty}: no usable trace rows" in proc.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "out").exists()


class _QuietHandler(BaseHTTPRequestHandler):
    """A test server's handler that logs nothing (http.server prints every request to stderr)."""

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def _serving(handler: type[BaseHTTPRequestHandler]):
    """A real HTTP server on a free port with ``handler``, for the duration; yields its ``/v1`` base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1"
    finally:
        server.shutdown()
        server.server_close()


class _TricklingHandler(_QuietHandler):
    """Sends the headers of a 200 and then one byte of its body every 0.1 s for 8 s: each read is quick, the answer
    never comes (a proxy keeping a dead upstream alive)."""

    stop = threading.Event()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Length", "100000")
        self.end_headers()
        try:
            for _ in range(80):
                if self.stop.wait(0.1):
                    return
                self.wfile.write(b" ")
                self.wfile.flush()
        except OSError:  # the client gave up and closed the connection
            pass


def test_a_server_trickling_its_answer_is_bounded_by_the_request_timeout(tmp_path):
    """httpx's timeout bounds each read, not the request: a server sending a byte every 0.1 s held a request (and
    the run) for as long as it kept sending, past endpoint.timeout_s and stall_timeout_s."""
    with _serving(_TricklingHandler) as url:
        try:
            t0 = time.monotonic()
            with pytest.raises(SummarizeFailed, match="no answer accepted") as e:
                run_pipeline(tmp_path, url, timeout_s=0.5, max_retries=1000, stall_timeout_s=1.0)
            seconds = time.monotonic() - t0
        finally:
            _TricklingHandler.stop.set()  # before the server's shutdown, which waits for the handler
    assert seconds < 1.0 + 0.5 + 3  # stall timeout + one request timeout + slack
    assert url in str(e.value) and "timeout: " in str(e.value)


def test_a_store_locked_by_another_process_stops_the_run_naming_it(tmp_path):
    """A store another process held a write lock on past sqlite's 5 s ended the run in its 'database is locked'
    traceback, without stats.json; now saving a summary there stops the fetch like a fatal endpoint error (what
    finished is written, the message names the store), and opening it is refused as an unavailable input."""
    import asyncio
    import sqlite3

    from test_summarize import settings, small_rows

    from data_prep.summarize import PROMPT_VERSION, fetch_summaries, plan_rows
    from data_prep.summary_store import StoreUnavailable

    path = tmp_path / "store.sqlite"
    SummaryStore(path, "fake-70b", PROMPT_VERSION).close()
    other = sqlite3.connect(path)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    try:
        with pytest.raises(StoreUnavailable, match=f"summary store {path}: database is locked"):
            SummaryStore(path, "fake-70b", PROMPT_VERSION, request_settings={"max_tokens": 32}, lock_timeout_s=0.1)
        store = SummaryStore(path, "fake-70b", PROMPT_VERSION, lock_timeout_s=0.1)  # reading needs no lock
        planned, _ = plan_rows(small_rows()[:1], settings("http://unused"))
        jobs = {k: (p.row.question, para.text) for p in planned for k, para in zip(p.keys, p.paragraphs)}
        with FakeServer() as server:
            report = asyncio.run(fetch_summaries(jobs, store, settings(server.base_url)))
        store.close()
    finally:
        other.rollback()
        other.close()
    assert report.fatal is not None and f"summary store {path}: database is locked" in report.fatal
    assert report.done == 0 and report.requested == len(jobs) > 0


class _BadGzipHandler(_QuietHandler):
    """Answers 200 with ``Content-Encoding: gzip`` and a body that is not gzip (a misconfigured proxy)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", "8")
        self.end_headers()
        self.wfile.write(b"not gzip")


def test_a_body_that_does_not_decode_is_a_failed_attempt_not_a_traceback(tmp_path):
    """httpx's DecodingError (a body its Content-Encoding does not decode) escaped the client's retry loop and ended
    the run in its traceback, without stats.json; now it is a bad_json attempt like any other malformed answer."""
    with _serving(_BadGzipHandler) as url, pytest.raises(SummarizeFailed, match="every request failed") as e:
        run_pipeline(tmp_path, url, rows=small_rows()[:1], max_retries=1)
    assert e.value.stats["attempts"]["bad_json"] == 2 * e.value.stats["summaries_requested"] > 0
    assert (tmp_path / "stats.json").exists()


@pytest.mark.parametrize(("override", "message"), [
    ("data=testbed", "data=testbed: summarize reads reasoning traces"),  # a KeyError traceback ('source')
    ("data.max_samples=0", r"data.max_samples=0 \(must be >= 1\)"),  # read one row without a word
    ("data.format=csv", "data.format must be one of"),  # a ValueError traceback from the loader
])  # fmt: skip
def test_data_settings_the_summariser_cannot_use_are_refused_by_name(tmp_path, override, message):
    from hydra import compose, initialize_config_dir

    from data_prep.summarize import run
    from zoomr.entry import CONF_DIR
    from zoomr.schemas import register_with_hydra
    from zoomr.schemas.checks import SettingsError

    register_with_hydra()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("data_prep", overrides=["+pipeline=summarize", override, f"pipeline.out_dir={tmp_path / 'out'}"])
    with pytest.raises(SettingsError, match=message):
        run(cfg)
    assert not (tmp_path / "out").exists()


class _RedirectHandler(_QuietHandler):
    """Answers every request with a 308 to https (a proxy moving the endpoint), with no body."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(308)
        self.send_header("Location", "https://llm.example/v1/chat/completions")
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_a_redirect_names_where_the_endpoint_moved(tmp_path):
    """A redirect stopped the run with "HTTP 308: ''", not saying where to; the message now names the Location."""
    moved = "HTTP 308: redirected to https://llm.example/v1/chat/completions; give the endpoint's own address as endpoint.base_url"
    with _serving(_RedirectHandler) as url, pytest.raises(SummarizeFailed, match=moved):
        run_pipeline(tmp_path, url, rows=small_rows()[:1])


def test_a_retry_after_given_as_an_http_date_is_honoured_and_capped():
    """``Retry-After: <HTTP date>`` (RFC 9110 allows it beside seconds) was read as no header, and the client backed
    off exponentially from a few ms, hammering a server that had said when to come back; now the date is honoured,
    capped by ``backoff_max_s`` like the seconds form."""
    import datetime
    from email.utils import format_datetime

    import httpx

    from data_prep.llm_client import ChatClient, EndpointSettings, _retry_after

    def after(value: str) -> float | None:
        return _retry_after(httpx.Response(429, headers={"Retry-After": value}))

    now = datetime.datetime.now(datetime.timezone.utc)
    soon = format_datetime(now + datetime.timedelta(seconds=30), usegmt=True)
    assert 25 <= after(soon) <= 30
    assert after(format_datetime(now - datetime.timedelta(hours=1), usegmt=True)) == 0.0  # already past: at once
    assert after("7") == 7.0 and after("soon") is None and after("Wed, 31 Feb 2015 07:28:00 GMT") is None
    client = ChatClient(EndpointSettings(backoff_max_s=2.0))
    assert client._backoff(0, after(soon)) == 2.0


def test_traces_sharing_an_id_are_refused_naming_the_ids_and_their_rows(tmp_path):
    """A trace file holding one trace twice (or two traces under one id) was summarised and written twice under that
    id, without a word; now the run is refused before anything is written, naming each id and its rows (lines)."""
    from hydra import compose, initialize_config_dir

    from data_prep.summarize import run, summarize_traces
    from data_prep.traces import TraceRow
    from zoomr.entry import CONF_DIR
    from zoomr.jsonl import BadRowError
    from zoomr.schemas import register_with_hydra

    src = (REPO_ROOT / "data_prep/data/traces/sky-t1-math-correct-5k-32b-ckpt140_aime24.jsonl").read_text().splitlines()
    traces = tmp_path / "dup.jsonl"
    traces.write_text("\n".join([*src[:3], src[0], ""]))
    register_with_hydra()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("data_prep", overrides=["+pipeline=summarize", f"data.path={traces}",
                                              f"pipeline.out_dir={tmp_path / 'out'}"])  # fmt: skip
    first = json.loads(src[0])["idx"]
    with pytest.raises(BadRowError, match=rf"{traces}: 1 trace id\(s\) appear more than once: id '{first}' on rows 1, 4;"):
        run(cfg)
    by_hand = [TraceRow("a", "q", "r"), TraceRow("b", "q", "r"), TraceRow("a", "q2", "r2")]
    with pytest.raises(BadRowError, match="id 'a' on rows #1, #3"):
        summarize_traces(by_hand, settings_for_refusal(), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def settings_for_refusal():
    from test_summarize import settings

    return settings(f"http://127.0.0.1:{free_port()}/v1")


@pytest.mark.parametrize(("url", "message"), [
    ("http://127.0.0.1:99999/v1", r"is not a URL the client can call \(Port out of range 0-65535\)"),  # ExceptionGroup
    ("http://[::1/v1", r"is not a URL the client can call \(Invalid IPv6 URL\)"),  # httpx.InvalidURL traceback
    ("http://:8000/v1", "names no host"),
])  # fmt: skip
def test_an_endpoint_url_no_request_can_go_to_is_refused_by_name(tmp_path, url, message):
    """A base_url with a port above 65535 ended the run in an ExceptionGroup traceback (an OverflowError deep in the
    connection pool), one with a torn IPv6 host in httpx's InvalidURL traceback; now both are refused as settings."""
    from hydra import compose, initialize_config_dir

    from data_prep.summarize import run
    from zoomr.entry import CONF_DIR
    from zoomr.schemas import register_with_hydra
    from zoomr.schemas.checks import SettingsError

    register_with_hydra()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("data_prep", overrides=["+pipeline=summarize", "+data=traces", f"pipeline.endpoint.base_url='{url}'",
                                              f"pipeline.out_dir={tmp_path / 'out'}"])  # fmt: skip
    with pytest.raises(SettingsError, match=rf"endpoint.base_url='{re.escape(url)}' {message}"):
        run(cfg)
    assert not (tmp_path / "out").exists()


def test_an_api_key_no_header_can_carry_is_refused_naming_the_variable_not_the_key(tmp_path, monkeypatch):
    """A key pasted with curly quotes ended the run in a UnicodeEncodeError traceback at the first request, after the
    output directory was written; now it is refused first, naming the variable and never the key."""
    from hydra import compose, initialize_config_dir

    from data_prep.summarize import run
    from zoomr.entry import CONF_DIR
    from zoomr.schemas import register_with_hydra
    from zoomr.schemas.checks import SettingsError

    monkeypatch.setenv("ZOOMR_PASTED_KEY", "\u201csk-secret\u201d")
    register_with_hydra()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("data_prep", overrides=["+pipeline=summarize", "+data=traces", f"pipeline.out_dir={tmp_path / 'out'}",
                                              "pipeline.endpoint.api_key_env=ZOOMR_PASTED_KEY"])  # fmt: skip
    with pytest.raises(SettingsError, match=r"the API key in \$ZOOMR_PASTED_KEY holds a character") as e:
        run(cfg)
    assert "secret" not in str(e.value) and not (tmp_path / "out").exists()


def test_a_rerun_resumes_the_output_directorys_wandb_run(tmp_path, monkeypatch):
    """Each rerun of a pipeline (a summarize run asking only for what is missing) started another W&B run, the
    finished one's figures twice in the project; now one W&B run per output directory is resumed, as eval keeps one
    per run directory. The run directory (``summarize-<model>``) is shared by every data set's run, so another
    ``pipeline.out_dir`` (another data set) is another W&B run."""
    from types import SimpleNamespace

    import wandb
    from hydra import compose, initialize_config_dir

    import data_prep.summarize as summarize
    from zoomr.entry import CONF_DIR
    from zoomr.schemas import register_with_hydra

    asked = []
    run = SimpleNamespace(summary={}, config=SimpleNamespace(update=lambda *a, **kw: None), finish=lambda: None)
    monkeypatch.setattr(wandb, "init", lambda **kw: asked.append(kw) or run)
    monkeypatch.setattr(summarize, "summarize_traces", lambda *a, **kw: {
        "rows_in": 1, "rows_written": 1, "rows_skipped": {}, "summaries_failed": 0})  # fmt: skip
    monkeypatch.delenv("WANDB_MODE", raising=False)
    register_with_hydra()
    for out in ("a", "a", "b"):
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            cfg = compose("data_prep", overrides=[
                "+pipeline=summarize", "pipeline.count_tokens=false", "pipeline.max_rows=1", "logger.mode=offline",
                f"pipeline.out_dir={tmp_path / out}", f"run_dir={tmp_path / 'run'}"])  # fmt: skip
        summarize.run(cfg)
    ids = [(kw["id"], kw["resume"]) for kw in asked]
    assert ids[0] == ids[1] and ids[0][0] and ids[0][1] == "allow" and ids[2][0] not in (None, ids[0][0])
