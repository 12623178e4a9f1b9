"""The generation step of the evaluator, behind one narrow call.

``generate(prompts, seeds) -> list[Generation]``: decode a batch of rendered prompts through the
cache library's engine (``zoomr/engine.py``) with whatever cache policy the run uses, and return for
each prompt its text, token ids, whether it hit the cap, and its resident-KV statistics. The
runner never touches the engine; tests can pass any callable with this signature.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Generation:
    """One decoded sample. ``kv``: numeric resident-KV statistics (see :mod:`eval.metrics`)."""

    text: str
    token_ids: list[int]
    truncated: bool
    prompt_tokens: int
    kv: dict[str, float] = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)


GenerateFn = Callable[[list[str], list[int]], list[Generation]]


def sample_seed(seed: int, problem_id: str, sample: int) -> int:
    """A per-(problem, sample) seed, so a sample's randomness does not depend on batching or resumes
    (where the engine supports per-row generators)."""
    digest = hashlib.sha256(f"{seed}/{problem_id}/{sample}".encode()).hexdigest()
    return int(digest[:15], 16)


def engine_generator(model: Any, tokenizer: Any, policy: Any, gen: Any) -> GenerateFn:
    """A :data:`GenerateFn` decoding through ``zoomr.engine`` with ``policy`` (None = full KV)."""
    try:
        import zoomr.engine  # noqa: F401
    except ImportError as e:
        raise RuntimeError(
            "zoomr.engine (the cache library's decode engine) is not available on this branch yet"
        ) from e
    raise NotImplementedError("wired when zoomr.engine lands")
