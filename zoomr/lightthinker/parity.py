"""Does the served model compute what the trainer trained? (LightThinker; cf. AbridgeKV appendix E.)

- parity: the trainer's single masked forward and the incremental generator (the engine with the
  ``lightthinker`` policy, which physically frees each thought once its cache tokens ran) give the same
  per-token CE on the generator's own tokens (bar: 4.5e-4; fp32 tiny models: ~1e-6);
- a deliberately wrong mask (plain causal over the same stream: thoughts never hidden) differs by
  orders of magnitude more;
- negative control: full attention over the uncompressed history (no cache tokens) is another function,
  and where it disagrees with the masked forward by > ``margin`` nats the served CE follows the mask.

A tiny random model rarely writes ``<|splitter|>`` itself, so the check can place splitters with an
engine ``script`` (the environment writes those tokens; everything else is greedy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from zoomr.abridge.data import collate
from zoomr.abridge.forward import full_kv_response_ce
from zoomr.abridge.parity import ce_checks, served_token_ce
from zoomr.lightthinker.layout import ThoughtTokens, interleave
from zoomr.lightthinker.mask import thought_response_ce


def splitter_script(tokenizer, every: Sequence[int], length: int) -> list[int | None]:
    """A script writing ``<|splitter|>`` at response positions ``every`` (the model writes the rest)."""
    from zoomr import tokens

    script: list[int | None] = [None] * length
    for t in every:
        script[t] = tokenizer.convert_tokens_to_ids(tokens.SPLITTER)
    return script


@torch.no_grad()
def parity_report(
    model,
    tokenizer,
    prompt_ids: list[int],
    num_cache_tokens: int,
    max_new_tokens: int,
    script: list[int | None] | None = None,
    margin: float = 0.05,
) -> dict[str, Any]:
    """All three checks of the module docstring on one greedy generation."""
    from zoomr.cache.lightthinker import LightThinkerCache, LightThinkerMethod

    cache = LightThinkerCache(
        LightThinkerMethod(), model.config, tokenizer, num_cache_tokens=num_cache_tokens
    )
    tokens, served, out = served_token_ce(model, tokenizer, prompt_ids, cache, max_new_tokens, script=script)
    device = next(model.parameters()).device
    tt = ThoughtTokens.from_tokenizer(tokenizer, num_cache_tokens)
    stream = interleave(prompt_ids, tokens, tt)
    batch = {k: v.to(device) for k, v in collate([stream], tokenizer.pad_token_id or 0).items()}
    f64 = torch.float64  # CE in float64: fp32 cancellation would add ~1e-5 nats on confident tokens
    trainer = thought_response_ce(model, batch, "auto", f64)[0]
    wrong = thought_response_ce(model, batch, "auto", f64, rule="causal")[0]
    full = full_kv_response_ce(model, batch, f64)[0]
    return {
        "tokens": len(tokens),
        "thoughts_freed": int(cache.thoughts_freed[0]) if cache.thoughts_freed is not None else 0,
        "forced_tokens_run": out.n_forced,
        **ce_checks(served, trainer, wrong, full, margin, "wrong_mask"),
        "final_rows": out.stats.rows[-1].tolist() if len(out.stats.rows) else [],
        "stream": stream,
    }
