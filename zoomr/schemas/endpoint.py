"""Where and how to call an OpenAI-compatible chat endpoint: a config the library owns.

``data_prep.llm_client.ChatClient`` sends the requests; the ``pipeline=summarize`` schema
(:class:`zoomr.schemas.zoomr.SummarizePipeline`) nests these settings under ``endpoint``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from zoomr.schemas.checks import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, SettingsError, check_fields

BODY_KEYS = ("model", "messages", "max_tokens", "temperature", "seed", "stream")  # what the client's request body sets


@dataclass
class EndpointSettings:
    """Where and how to call the summariser (ZoomR A.1: Llama-3-70B behind an OpenAI-compatible server)."""

    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = "meta-llama/Meta-Llama-3-70B-Instruct"
    api_key_env: str | None = "OPENAI_API_KEY"  # name of the environment variable holding the key
    concurrency: int = 64
    timeout_s: float = 120.0
    max_retries: int = 8
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    stall_timeout_s: float = 600.0  # stop when no answer has been accepted for this long
    max_tokens: int = 128
    temperature: float = 0.0
    seed: int | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_fields(self, "pipeline.endpoint", concurrency=AT_LEAST_ONE, max_retries=NON_NEGATIVE, timeout_s=POSITIVE,
                     stall_timeout_s=POSITIVE, backoff_base_s=NON_NEGATIVE, backoff_max_s=NON_NEGATIVE,
                     max_tokens=AT_LEAST_ONE, temperature=NON_NEGATIVE)  # fmt: skip
        if own := sorted(set(self.extra_body) & set(BODY_KEYS)):  # replaced the client's own: stream=true, an SSE
            raise ValueError(  # body every attempt read as bad JSON; max_tokens another limit than the recorded one
                f"pipeline.endpoint.extra_body sets {', '.join(own)}, which the client sends itself: give "
                f"pipeline.endpoint.<key> instead (stream cannot be set: the client reads whole answers)"
            )
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"endpoint.base_url must be an http(s) URL, got {self.base_url!r}")
        try:  # a port above 65535 was an OverflowError in an ExceptionGroup traceback, "http://[::1/v1" httpx's InvalidURL
            host, _ = urlsplit(self.base_url).hostname, urlsplit(self.base_url).port
        except ValueError as e:
            raise ValueError(f"endpoint.base_url={self.base_url!r} is not a URL the client can call ({e})") from None
        if not host:
            raise ValueError(f"endpoint.base_url={self.base_url!r} names no host (e.g. http://127.0.0.1:8000/v1)")

    def api_key(self) -> str | None:
        """The key in ``api_key_env``; one no HTTP header can carry (a character outside ASCII, e.g. a pasted curly
        quote, was a UnicodeEncodeError traceback at the first request) is refused naming the variable, never the key."""
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if key is not None and not (key.isascii() and key.isprintable()):
            raise SettingsError(f"the API key in ${self.api_key_env} holds a character an HTTP header cannot carry (a "
                                "non-ASCII or control character, e.g. a pasted quote); set it to the key alone")  # fmt: skip
        return key

    def __repr__(self) -> str:  # the key is never part of the settings, but keep reprs short and safe
        return f"EndpointSettings(base_url={self.base_url!r}, model={self.model!r}, concurrency={self.concurrency})"
