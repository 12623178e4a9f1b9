"""The paper's learning-rate schedule (AbridgeKV appendix "training"): linear warm-up over the first 3%,
constant peak until 80%, linear decay to 10% of the peak at the end.

The paper states the fractions in response tokens; here they are fractions of optimizer steps, which
is the same when every step carries the same number of tokens (fixed batch, responses truncated to
``max_response_tokens``; short responses make a step lighter).
"""

from __future__ import annotations


def lr_factor(
    step: int,
    total_steps: int,
    warmup_fraction: float = 0.03,
    decay_start_fraction: float = 0.8,
    final_fraction: float = 0.1,
) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based) of ``total_steps``."""
    if not 0 <= warmup_fraction <= decay_start_fraction <= 1:
        raise ValueError("need 0 <= warmup_fraction <= decay_start_fraction <= 1")
    warmup = warmup_fraction * total_steps
    decay_start = decay_start_fraction * total_steps
    if step < warmup:
        return (step + 1) / warmup if warmup >= 1 else 1.0
    if step < decay_start or total_steps <= decay_start:
        return 1.0
    progress = min(1.0, (step + 1 - decay_start) / (total_steps - decay_start))  # last step: final
    return 1.0 - (1.0 - final_fraction) * progress
