"""The summariser against a real OpenAI-compatible server process: ``transformers serve`` with the tiny model.

The tiny model is random, so its "summaries" are gibberish (and some contain special-token strings,
which the validator rejects): the test checks the protocol, persistence and determinism, not quality.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time

import httpx
import pytest

from data_prep.fake_llm_server import free_port
from data_prep.llm_client import ChatClient
from data_prep.summarize import clean_summary, summarize_traces, summary_messages, summary_validator
from tests.conftest import tiny_spec
from tests.test_summarize import settings, small_rows

pytestmark = pytest.mark.skipif(shutil.which("transformers") is None, reason="transformers CLI not installed")


@pytest.fixture(scope="session")
def served_tiny(cache_dir):
    """(base_url, model) of ``transformers serve`` on loopback; ready in ~5-20 s on this CPU."""
    from zoomr.models import build_tiny

    model_dir = str(build_tiny(tiny_spec("qwen2"), cache_dir))
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        ["transformers", "serve", model_dir, "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 120
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"transformers serve exited: {proc.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.time() > deadline:
                raise RuntimeError("transformers serve not ready after 120 s")
            time.sleep(0.3)
        yield f"http://127.0.0.1:{port}/v1", model_dir
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _settings(url: str, model: str):
    s = settings(
        url, concurrency=4, max_retries=1, timeout_s=60.0, min_chars=1500, reject_truncated_answers=False
    )
    s.endpoint.model = model
    s.endpoint.max_tokens = 8
    return s


def test_pipeline_against_transformers_serve(served_tiny, tmp_path):
    url, model = served_tiny
    rows = small_rows()[:2]
    s = _settings(url, model)
    stats = summarize_traces(rows, s, tmp_path)
    assert stats["summaries_requested"] == stats["unique_paragraphs"] > 0
    assert stats["summaries_new"] + stats["summaries_failed"] == stats["summaries_requested"]
    assert stats["summaries_new"] > 0
    assert stats["rows_written"] + stats["rows_incomplete"] == 2
    assert stats["attempts"]["ok"] == stats["summaries_new"]

    # greedy decoding: a direct request for a stored paragraph gets the stored summary back
    from data_prep.summary_store import SummaryStore, paragraph_hash
    from zoomr.segments import split_paragraphs, split_thought

    row = rows[0]
    paras = split_paragraphs(split_thought(row.response).thought, s.min_paragraph_chars)

    async def direct(paragraph: str) -> str:
        async with ChatClient(s.endpoint) as c:
            return (await c.complete(summary_messages(row.question, paragraph))).text

    with SummaryStore(tmp_path / "store.sqlite", model, "zoomr-summary-v1") as store:
        stored = [(p, store.get(paragraph_hash(row.question, p.text))) for p in paras]
    p, hit = next((p, h) for p, h in stored if h is not None)
    assert clean_summary(asyncio.run(direct(p.text))) == hit.summary
    assert summary_validator(False)(hit.summary, "length") is None

    # a rerun asks again only for the paragraphs that failed
    again = summarize_traces(rows, s, tmp_path)
    assert again["summaries_requested"] == stats["summaries_failed"]
    assert again["summaries_cached"] == stats["summaries_new"]
