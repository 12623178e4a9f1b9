"""Does the served model compute what the trainer trained? (AbridgeKV appendix E, Table 10.)

- parity: the trainer's single masked forward and the incremental generator (the engine with the
  ``abridge`` policy, which physically frees each block) give the same per-token CE on the generator's
  own tokens (paper: within 4.5e-4; fp32 tiny models: ~1e-6);
- a deliberately wrong schedule in the trainer's forward differs by orders of magnitude more;
- negative control: replaying the generation with full attention over the uncompressed history gives
  different CE, and on the tokens where that replay and the masked forward disagree by > ``margin``
  nats, the served CE follows the masked forward (the served model does not see compressed history).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from zoomr.abridge.data import collate
from zoomr.abridge.forward import full_kv_response_ce, stream_response_ce
from zoomr.abridge.layout import AbridgeLayout, interleave, pause_token_ids


@torch.no_grad()
def served_token_ce(model, tokenizer, prompt_ids: list[int], cache, max_new_tokens: int, script=None):
    """Greedy-decode one prompt with ``cache``; return (tokens, float64 CE of each token under the served
    logits, the engine's output). ``script``: response tokens the environment writes (see the engine).

    A forward hook records the logits each forward ends with: for one sequence, the engine samples from
    exactly those (the prefill's last position, a decode token, or the last pause token).
    """
    from zoomr.engine import DecodeSettings, generate

    seen: list[torch.Tensor] = []
    hook = model.register_forward_hook(lambda mod, inp, out: seen.append(out.logits[0, -1].double()))
    try:
        settings = DecodeSettings(max_new_tokens=max_new_tokens, stop_token_ids=[], progress=False)
        scripts = None if script is None else [script]
        out = generate(model, tokenizer, [prompt_ids], cache, settings, script=scripts)[0]
    finally:
        hook.remove()
    tokens = out.token_ids
    ce = torch.stack([torch.logsumexp(lg, -1) - lg[t] for lg, t in zip(seen, tokens)])
    return tokens, ce, out


@torch.no_grad()
def parity_report(
    model,
    tokenizer,
    prompt_ids: list[int],
    layout: AbridgeLayout,
    quotas: Sequence[int],
    wrong_quotas: Sequence[int],
    max_new_tokens: int,
    margin: float = 0.05,
) -> dict[str, Any]:
    """All three checks of the module docstring on one greedy generation."""
    from zoomr.cache.abridge import AbridgeCache, AbridgeMethod

    cache = AbridgeCache(AbridgeMethod(), model.config, tokenizer, layout=layout, quotas=list(quotas))
    tokens, served, out = served_token_ce(model, tokenizer, prompt_ids, cache, max_new_tokens)
    device = next(model.parameters()).device
    stream = interleave(prompt_ids, tokens, layout, pause_token_ids(tokenizer, layout.num_pause))
    batch = {k: v.to(device) for k, v in collate([stream], tokenizer.pad_token_id or 0).items()}
    f64 = torch.float64  # CE in float64: fp32 cancellation would add ~1e-5 nats on confident tokens
    trainer = stream_response_ce(model, batch, list(quotas), "auto", f64)[0]
    wrong = stream_response_ce(model, batch, list(wrong_quotas), "auto", f64)[0]
    full = full_kv_response_ce(model, batch, f64)[0]
    return {
        "tokens": len(tokens),
        "pause_tokens_run": out.n_forced,
        **ce_checks(served, trainer, wrong, full, margin, "wrong_schedule"),
        "final_rows_per_layer": out.stats.rows[-1].mean(-1).tolist() if len(out.stats.rows) else [],
    }


def ce_checks(served, trainer, wrong, full, margin: float, wrong_name: str) -> dict[str, Any]:
    """The three checks of the module docstring from per-token CE vectors of the served model, the
    trainer's forward, the deliberately wrong one and the full-history replay."""
    diff = (served - trainer).abs()
    disagree = (full - trainer).abs() > margin
    follows = (served - trainer).abs() < (served - full).abs()
    return {
        "max_abs_ce_diff": float(diff.max()),
        "mean_abs_ce_diff": float(diff.mean()),
        f"{wrong_name}_max_abs_ce_diff": float((served - wrong).abs().max()),
        "wrong_over_parity": float((served - wrong).abs().max() / diff.max().clamp_min(1e-12)),
        "full_history_max_abs_ce_diff": float((served - full).abs().max()),
        "disagreeing_tokens": int(disagree.sum()),
        "served_follows_compressing": int((disagree & follows).sum()),
    }
