"""A fault-injecting OpenAI-compatible chat server (FastAPI) for testing and benchmarking the summariser.

Answers are a deterministic function of the paragraph in the request, so a run through faults must
give byte-identical output to a clean run. Faults, drawn per request: HTTP 429 (with ``Retry-After``)
or 500, responses slower than the client's timeout, garbage JSON, empty content, special-token
content, content longer than the request's ``max_tokens`` reported as finished (``"stop"``). ``latency_s``
simulates a batching server (each request waits, none blocks another).

    server = FakeServer(FaultPlan(error_rate=0.2, ...)); server.start(); ...; server.stop()
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import socket
import threading
import time
from dataclasses import dataclass, field

from starlette.requests import Request  # FastAPI resolves the handler's annotation from module globals

PARAGRAPH_MARK = "Paragraph:\n"


@dataclass
class FaultPlan:
    error_rate: float = 0.0  # half 429, half 500
    slow_rate: float = 0.0  # sleep slow_s (longer than the client's timeout)
    garbage_rate: float = 0.0  # 200 with a body that is not a chat completion
    empty_rate: float = 0.0  # 200 with empty content
    special_rate: float = 0.0  # 200 with a special token in the content
    overlong_rate: float = 0.0  # 200 with more words than max_tokens, finish_reason "stop" (max_tokens ignored)
    slow_s: float = 1.0
    latency_s: float = 0.0  # added to every answer (a server busy elsewhere)
    seed: int = 0
    expected_key: str | None = None  # when set, requests without "Bearer <key>" get 401


def fake_summary(paragraph: str) -> str:
    """The deterministic 'summary' of a paragraph."""
    words = paragraph.split()[:6]
    return f"[{hashlib.sha256(paragraph.encode()).hexdigest()[:10]}] " + " ".join(words)


def _paragraph_of(messages: list[dict]) -> str:
    user = next((m.get("content", "") for m in messages if m.get("role") == "user"), "")
    text = user.split(PARAGRAPH_MARK, 1)[-1]
    return text.rsplit("\n\nSummary:", 1)[0]


@dataclass
class ServerLog:
    requests: int = 0
    by_outcome: dict[str, int] = field(default_factory=dict)
    paragraphs: dict[str, int] = field(default_factory=dict)  # successful answers per paragraph
    auth_headers: list[str] = field(default_factory=list)

    def count(self, outcome: str) -> None:
        self.by_outcome[outcome] = self.by_outcome.get(outcome, 0) + 1


def make_app(plan: FaultPlan, log: ServerLog):
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, PlainTextResponse

    app = FastAPI()
    rng = random.Random(plan.seed)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        log.requests += 1
        auth = request.headers.get("authorization", "")
        log.auth_headers.append(auth)
        if plan.expected_key is not None and auth != f"Bearer {plan.expected_key}":
            log.count("401")
            return JSONResponse({"error": "bad key"}, status_code=401)
        body = await request.json()
        if plan.latency_s:
            await asyncio.sleep(plan.latency_s)
        r = rng.random()
        edges = [plan.error_rate, plan.slow_rate, plan.garbage_rate, plan.empty_rate, plan.special_rate,
                 plan.overlong_rate]  # fmt: skip
        kind, acc = "ok", 0.0
        for name, p in zip(["error", "slow", "garbage", "empty", "special", "overlong"], edges):
            acc += p
            if r < acc:
                kind = name
                break
        log.count(kind)
        if kind == "error":
            if rng.random() < 0.5:
                return JSONResponse({"error": "rate limited"}, status_code=429, headers={"Retry-After": "0"})
            return PlainTextResponse("internal error", status_code=500)
        if kind == "slow":
            await asyncio.sleep(plan.slow_s)
        if kind == "garbage":
            return PlainTextResponse(rng.choice(['{"choices": [', "<html>oops</html>", '{"choices": []}']))
        paragraph = _paragraph_of(body.get("messages", []))
        content = {"empty": "  ", "special": "<|end_of_summary|> oops"}.get(kind, fake_summary(paragraph))
        if kind == "overlong":
            content += " and so on" * int(body.get("max_tokens") or 16)
        if kind in ("ok", "slow"):
            log.paragraphs[paragraph] = log.paragraphs.get(paragraph, 0) + 1
        return {
            "id": "fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [
                {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": len(content.split()), "total_tokens": 0},
        }

    return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeServer:
    """Uvicorn serving :func:`make_app` on a free loopback port, in a background thread."""

    def __init__(self, plan: FaultPlan | None = None, port: int | None = None):
        import uvicorn

        self.plan = plan or FaultPlan()
        self.log = ServerLog()
        self.port = port or free_port()
        config = uvicorn.Config(
            make_app(self.plan, self.log), host="127.0.0.1", port=self.port, log_level="error"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FakeServer:
        self._thread.start()
        deadline = time.time() + 10
        while not self._server.started:
            if time.time() > deadline:
                raise RuntimeError("fake server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=5)

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    """``python -m data_prep.fake_llm_server --port 8000 --error-rate 0.2``: serve until Ctrl-C."""
    import argparse

    from zoomr.startup import started

    started()  # Ctrl-C stops the server (data_prep's __init__ made it one line while importing)

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=8000)
    for name in (
        "error_rate",
        "slow_rate",
        "garbage_rate",
        "empty_rate",
        "special_rate",
        "overlong_rate",
        "slow_s",
        "latency_s",
    ):
        p.add_argument(f"--{name.replace('_', '-')}", type=float, default=getattr(FaultPlan(), name))
    args = p.parse_args()
    plan = FaultPlan(**{k: v for k, v in vars(args).items() if k != "port"})
    server = FakeServer(plan, port=args.port).start()
    print(f"fake OpenAI-compatible server at {server.base_url}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
