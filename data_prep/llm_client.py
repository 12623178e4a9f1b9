"""Async client for an OpenAI-compatible ``/v1/chat/completions`` endpoint (vLLM, ``transformers serve``, …).

Retries with exponential backoff (full jitter, ``Retry-After`` honoured, seconds or an HTTP date) on 429, 5xx, timeouts,
connection errors, malformed JSON (or a body its Content-Encoding does not decode) and answers the caller's validator rejects; other 4xx answers
(bad model name, bad key) fail at once. A refused connection before the endpoint has ever answered
(nothing listening: wrong port, server not started) fails at once too (:class:`EndpointUnreachable`);
once it has answered, a refused connection is a transient error. When no answer has been accepted for
``stall_timeout_s`` (a hanging or always-failing server) every request stops (:class:`EndpointStalled`),
so a run's time is bounded by about ``stall_timeout_s + timeout_s`` (``timeout_s`` bounds a whole request,
not each read: a server trickling its answer byte by byte is a timeout too). The API key is read from the environment variable named in
the settings, sent only in the ``Authorization`` header, and never logged or stored.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from zoomr.schemas.endpoint import EndpointSettings

log = logging.getLogger(__name__)

RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


@dataclass
class Completion:
    text: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    attempts: int


class RequestFailed(RuntimeError):
    """All retries were spent (the last reason is in the message)."""


class FatalRequestError(RuntimeError):
    """An answer that retrying cannot fix (HTTP 4xx other than 408/409/425/429)."""


class EndpointUnreachable(FatalRequestError):
    """Nothing accepts connections at the endpoint (and it has not answered before in this run)."""


class EndpointStalled(FatalRequestError):
    """No answer was accepted for ``stall_timeout_s``: the server hangs or fails every request."""


Validator = Callable[[str, str | None, int | None], str | None]  # (text, finish_reason, completion_tokens) -> rejection reason or None


class ChatClient:
    """``async with ChatClient(settings) as c: await c.complete(messages, validate)``.

    ``stats`` counts attempts by outcome (``ok``, ``http_429``, ``http_500``, ``timeout``, ``connect``,
    ``bad_json``, ``rejected:<reason>``) across all calls.
    """

    def __init__(self, settings: EndpointSettings, transport: httpx.AsyncBaseTransport | None = None):
        self.settings = settings
        self.stats: Counter = Counter()
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._answered = False  # any HTTP response seen: a refused connection is transient from then on
        self._last_ok = time.monotonic()

    async def __aenter__(self) -> ChatClient:
        s = self.settings
        headers = {"Content-Type": "application/json"}
        key = s.api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        limits = httpx.Limits(max_connections=s.concurrency, max_keepalive_connections=s.concurrency)
        self._client = httpx.AsyncClient(
            base_url=s.base_url.rstrip("/"),
            headers=headers,
            timeout=httpx.Timeout(s.timeout_s),
            limits=limits,
            transport=self._transport,
        )
        self._last_ok = time.monotonic()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _body(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        s = self.settings
        body: dict[str, Any] = {
            "model": s.model,
            "messages": messages,
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "stream": False,
        }
        if s.seed is not None:
            body["seed"] = s.seed
        body.update(s.extra_body)
        return body

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        s = self.settings
        if retry_after is not None:
            return min(retry_after, s.backoff_max_s)
        return random.uniform(0, min(s.backoff_max_s, s.backoff_base_s * 2**attempt))

    async def complete(self, messages: list[dict[str, str]], validate: Validator | None = None) -> Completion:
        """One chat completion, retried until valid or ``max_retries`` retries are spent."""
        if self._client is None:
            raise RuntimeError("use ChatClient inside `async with`")
        last = "no attempt"
        for attempt in range(self.settings.max_retries + 1):
            self._check_stalled(last)
            retry_after = None
            try:  # timeout_s bounds the whole request: httpx's timeout is per read, so a trickling server never hit it
                resp = await asyncio.wait_for(
                    self._client.post("/chat/completions", json=self._body(messages)), self.settings.timeout_s
                )
            except (httpx.TimeoutException, TimeoutError):
                last = "timeout"
            except httpx.ConnectError as e:
                last = f"connect:{type(e).__name__}"
                if not self._answered:
                    self.stats["connect"] += 1
                    raise EndpointUnreachable(
                        f"{self.settings.base_url}: cannot connect ({e or type(e).__name__}); is the server "
                        "running, and are the host and port right?"
                    ) from None
            except httpx.TransportError as e:
                last = f"connect:{type(e).__name__}"
            except httpx.DecodingError:  # a body its Content-Encoding does not decode: not a chat completion either
                last = "bad_json"
            else:
                self._answered = True
                if resp.status_code != 200:
                    last = f"http_{resp.status_code}"
                    if resp.status_code not in RETRY_STATUS and not 500 <= resp.status_code < 600:
                        self.stats[last] += 1
                        if resp.has_redirect_location:  # not followed: a POST's body may not survive a redirect
                            raise FatalRequestError(
                                f"{self.settings.base_url}: HTTP {resp.status_code}: redirected to "
                                f"{resp.headers['location']}; give the endpoint's own address as endpoint.base_url"
                            )
                        raise FatalRequestError(
                            f"{self.settings.base_url}: HTTP {resp.status_code}: {resp.text[:300]!r}"
                        )
                    retry_after = _retry_after(resp)
                else:
                    parsed = _parse(resp)
                    if isinstance(parsed, str):
                        last = parsed
                    else:
                        text, finish, usage = parsed
                        reason = validate(text, finish, usage.get("completion_tokens")) if validate else None
                        if reason is None:
                            self.stats["ok"] += 1
                            self._last_ok = time.monotonic()
                            return Completion(
                                text,
                                finish,
                                usage.get("prompt_tokens"),
                                usage.get("completion_tokens"),
                                attempt + 1,
                            )
                        last = f"rejected:{reason}"
            self.stats[last.split(":")[0] if last.startswith("connect") else last] += 1
            if attempt < self.settings.max_retries:
                left = self.settings.stall_timeout_s - (time.monotonic() - self._last_ok)
                await asyncio.sleep(max(0.0, min(self._backoff(attempt, retry_after), left)))
        raise RequestFailed(f"gave up after {self.settings.max_retries + 1} attempts; last: {last}")


    def _check_stalled(self, last: str) -> None:
        quiet = time.monotonic() - self._last_ok
        if quiet > self.settings.stall_timeout_s:
            raise EndpointStalled(
                f"{self.settings.base_url}: no answer accepted for {quiet:.0f} s "
                f"(endpoint.stall_timeout_s={self.settings.stall_timeout_s:g}); last failure: {last}"
            )


def _retry_after(resp: httpx.Response) -> float | None:
    """Seconds to wait that ``Retry-After`` asks for: a number of seconds or an HTTP date (RFC 9110 §10.2.3)."""
    value = resp.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # an HTTP date is always GMT; a date without a zone is read as one
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(0.0, (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds())


def _parse(resp: httpx.Response) -> tuple[str, str | None, dict[str, Any]] | str:
    """(text, finish_reason, usage) of a chat completion, or a short reason why it is malformed."""
    try:
        data = resp.json()
        choice = data["choices"][0]
        text = choice["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return "bad_json"
    if not isinstance(text, str):
        return "bad_json"
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    counts = {k: v for k, v in usage.items() if k.endswith("_tokens") and type(v) is int}  # a count, or unknown
    return text, choice.get("finish_reason"), counts
