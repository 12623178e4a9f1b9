"""Throughput of the summariser at several concurrencies against real loopback servers (table + JSON).

    python -m data_prep.bench_summarize --servers fake serve serve-cb --concurrency 1 8 --out runs/bench/summarize.json

Servers: ``fake`` (data_prep.fake_llm_server with a fixed per-request latency: a batching server whose
answer time does not grow with load, like vLLM far from saturation), ``serve`` (``transformers serve``
with the tiny model, one request at a time), ``serve-cb`` (the same with ``--continuous-batching``).
Each (server, concurrency) run summarises the same paragraphs into a fresh store.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from data_prep.fake_llm_server import FakeServer, FaultPlan, free_port
from data_prep.llm_client import EndpointSettings
from data_prep.summarize import SummarizeSettings, summarize_traces
from data_prep.traces import load_trace_rows
from zoomr.paths import output_file

TRACES = "data_prep/data/traces/sky-t1-math-correct-5k-32b-ckpt140_aime24.jsonl"


@contextmanager
def transformers_serve(model_dir: str, continuous_batching: bool):
    port = free_port()
    cmd = ["transformers", "serve", model_dir, "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"]
    if continuous_batching:
        cmd.append("--continuous-batching")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            raise RuntimeError("transformers serve did not start")
        yield f"http://127.0.0.1:{port}/v1", model_dir
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextmanager
def fake_server(latency_s: float):
    with FakeServer(FaultPlan(latency_s=latency_s)) as server:
        yield server.base_url, "fake-70b"


def run_once(rows, url: str, model: str, concurrency: int, max_tokens: int, min_chars: int) -> dict:
    endpoint = EndpointSettings(
        base_url=url, model=model, api_key_env=None, concurrency=concurrency, timeout_s=600,
        max_retries=2, max_tokens=max_tokens,
    )  # fmt: skip
    settings = SummarizeSettings(
        endpoint=endpoint, min_paragraph_chars=min_chars, reject_truncated_answers=False, progress=False
    )
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        stats = summarize_traces(rows, settings, tmp)
        wall = time.perf_counter() - t0
    return {
        "requests": stats["summaries_requested"],
        "ok": stats["summaries_new"],
        "failed": stats["summaries_failed"],
        "fetch_s": stats["seconds"],
        "wall_s": round(wall, 2),
        "summaries_per_s": stats["summaries_per_second"],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--servers", nargs="+", choices=["fake", "serve", "serve-cb"], default=["fake", "serve", "serve-cb"])
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 8])
    p.add_argument("--rows", type=int, default=3)
    p.add_argument("--min-chars", type=int, default=300)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--latency", type=float, default=0.2, help="fake server: seconds per request")
    p.add_argument("--out", type=output_file, default="runs/bench/summarize.json")
    args = p.parse_args(argv)
    # checked before any server starts: --concurrency 0 / --max-tokens 0 were EndpointSettings' ValueError traceback
    # after the warm-up (and after the servers before), --rows -1 benched all rows but one without a word
    for flag, values, least in (("--concurrency", args.concurrency, 1), ("--rows", [args.rows], 1),
                                ("--max-tokens", [args.max_tokens], 1), ("--min-chars", [args.min_chars], 0)):
        if any(v < least for v in values):
            p.error(f"{flag} must be >= {least}, got {' '.join(map(str, values))}")
    if not args.latency >= 0 or args.latency == float("inf"):
        p.error(f"--latency must be a number of seconds >= 0, got {args.latency}")

    from zoomr.models import build_tiny, tiny_spec  # the tiny model the tests serve

    rows, _ = load_trace_rows(source="local", path=TRACES, format="skythought_eval")
    rows = sorted((r for r in rows if "<|end_of_thought|>" in r.response), key=lambda r: len(r.response))
    rows = rows[: args.rows]
    servers = {
        "fake": lambda: fake_server(args.latency),
        "serve": lambda: transformers_serve(str(build_tiny(tiny_spec("qwen2"))), False),
        "serve-cb": lambda: transformers_serve(str(build_tiny(tiny_spec("qwen2"))), True),
    }
    results = []
    for name in args.servers:
        with servers[name]() as (url, model):
            run_once(rows[:1], url, model, 2, args.max_tokens, args.min_chars)  # warm-up
            for c in args.concurrency:
                r = {
                    "server": name,
                    "concurrency": c,
                    **run_once(rows, url, model, c, args.max_tokens, args.min_chars),
                }
                results.append(r)
                print(json.dumps(r), flush=True)
    for name in args.servers:
        base = next(r for r in results if r["server"] == name and r["concurrency"] == min(args.concurrency))
        for r in results:
            if r["server"] == name:
                r["speedup"] = round(base["fetch_s"] / r["fetch_s"], 2) if r["fetch_s"] else None
    header = (
        f"{'server':<10}{'conc':>6}{'requests':>10}{'failed':>8}{'fetch s':>10}{'summ/s':>9}{'speedup':>9}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for r in results:
        print(
            f"{r['server']:<10}{r['concurrency']:>6}{r['requests']:>10}{r['failed']:>8}{r['fetch_s']:>10.2f}"
            f"{r['summaries_per_s']:>9.2f}{r['speedup']:>9}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"threads": os.environ.get("OMP_NUM_THREADS"), "rows": len(rows), "max_tokens": args.max_tokens}
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    print(f"\nwritten {out}")


if __name__ == "__main__":
    from zoomr.script import run_script

    run_script(main)
