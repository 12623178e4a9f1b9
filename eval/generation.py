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

import numpy as np


@dataclass
class Generation:
    """One decoded sample. ``kv``: numeric resident-KV statistics (see :mod:`eval.metrics`)."""

    text: str
    token_ids: list[int]
    truncated: bool
    prompt_tokens: int
    kv: dict[str, float] = field(default_factory=dict)
    decode: dict[str, Any] = field(default_factory=dict)  # what the generator's inspect hook read off the decode

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)


# generate(prompts, seeds[, scripts]): scripts (optional) are the environment's tokens per prompt
GenerateFn = Callable[..., list[Generation]]
# inspect(cache, index in the batch, engine output) -> JSON-serialisable details of one sample, read off
# the decode after it finished (e.g. ZoomR's recompute log, the per-step resident rows)
Inspect = Callable[[Any, int, Any], dict[str, Any]]


def sample_seed(seed: int, problem_id: str, sample: int) -> int:
    """A per-(problem, sample) seed, so a sample's randomness does not depend on batching or resumes
    (where the engine supports per-row generators)."""
    digest = hashlib.sha256(f"{seed}/{problem_id}/{sample}".encode()).hexdigest()
    return int(digest[:15], 16)


def kv_stats(stats: Any, prompt_tokens: int, n_tokens: int) -> dict[str, float]:
    """Resident-KV summary of one sequence from the engine's per-step stats (rows ``[T, L, H]``, bytes ``[T]``).

    rows_* are rows per (layer, KV head): ``rows_mean`` over decode steps, ``rows_peak`` the largest step,
    ``rows_final`` at the end. ``kv_per_512`` (AbridgeKV's budget unit) = 512 x (final rows beyond the
    prompt length) / (generated tokens that entered the cache, i.e. all but the last sampled one): exactly
    512 for full KV; for a compressing policy it also counts the open block and its code (pause) rows.
    It assumes the prompt stays whole (full, AbridgeKV, ZoomR, LightThinker); for policies that also evict
    prompt rows, ``kv_per_512_all`` = 512 x final rows / (prompt + cached generated tokens) is the
    resident share of the whole sequence. ``compression`` = 1 - final rows / (prompt + cached generated
    tokens) and ``prefill_compression`` = 1 - rows after the prefill step / prompt tokens are the fraction
    of KV pairs removed (kvpress's and the KVzap paper's compression ratio), per sequence.
    """
    rows = np.asarray(stats.rows, dtype=float)
    if rows.size == 0:
        return {}
    per_step = rows.reshape(rows.shape[0], -1).mean(axis=1)  # mean over layers and KV heads
    decode = per_step[1:] if len(per_step) > 1 else per_step
    kv_bytes = np.asarray(stats.kv_bytes, dtype=float)
    dec_bytes = kv_bytes[1:] if len(kv_bytes) > 1 else kv_bytes
    final = float(per_step[-1])
    return {
        "rows_mean": float(decode.mean()),
        "rows_peak": float(per_step.max()),
        "rows_final": final,
        "bytes_mean": float(dec_bytes.mean()) if dec_bytes.size else 0.0,
        "bytes_peak": float(kv_bytes.max()) if kv_bytes.size else 0.0,
        "kv_per_512": 512.0 * max(final - prompt_tokens, 0.0) / max(n_tokens - 1, 1),
        "kv_per_512_all": 512.0 * final / max(prompt_tokens + n_tokens - 1, 1),
        # fraction of KV pairs removed (kvpress / KVzap): at the end, and right after prefill
        "compression": 1.0 - final / max(prompt_tokens + n_tokens - 1, 1),
        "prefill_compression": 1.0 - float(per_step[0]) / max(prompt_tokens, 1),
    }


def jsonable(details: dict[str, Any]) -> dict[str, Any]:
    """``details`` as they read back from ``results.jsonl`` (tensors and numpy scalars as numbers, dict keys
    as strings), so a fresh row and a resumed one hold the same values."""
    import json

    return json.loads(json.dumps(details, default=lambda x: x.tolist() if hasattr(x, "tolist") else str(x)))


def engine_generator(
    model: Any,
    tokenizer: Any,
    policy: Any | None,
    gen: Any,
    inspect: Inspect | None = None,
    stop_token_ids: list[int] | None = None,
) -> GenerateFn:
    """A :data:`GenerateFn` decoding through ``zoomr.engine.generate`` with the cache policy config
    ``policy`` (its config dataclass, typed once by the entry point; None = full KV). A fresh cache is built
    from it for every batch, the config itself never rebuilt;
    ``inspect`` reads per-sample details off it and the engine's outputs (:attr:`Generation.decode`).
    ``stop_token_ids``: what ends a sample (None: the model's and the tokenizer's EOS)."""
    from zoomr.cache import build_policy
    from zoomr.engine import DecodeSettings, generate

    def run(prompts: list[str], seeds: list[int], scripts: list[list[int | None]] | None = None) -> list[Generation]:
        settings = DecodeSettings(
            max_new_tokens=gen.max_new_tokens,
            temperature=gen.temperature,
            top_p=gen.top_p,
            top_k=gen.top_k,
            seed=list(seeds),
            stop_token_ids=stop_token_ids,
            progress=False,
        )
        cache = build_policy(policy or {"policy": "full"}, model.config, tokenizer) if inspect else policy
        outs = generate(model, tokenizer, prompts, cache, settings, script=scripts)
        return [
            Generation(
                text=o.text,
                token_ids=list(o.token_ids),
                truncated=bool(o.hit_cap),
                prompt_tokens=o.prompt_tokens,
                kv=kv_stats(o.stats, o.prompt_tokens, o.n_tokens),
                decode=jsonable(inspect(cache, i, o)) if inspect else {},
            )
            for i, o in enumerate(outs)
        ]

    return run
