"""Schemas of masked training (AbridgeKV, LightThinker) and AbridgeKV's layer allocation (``+method=abridge_allocate``).

The ``+method=abridge`` config (training and serving) lives with its policy in :mod:`zoomr.cache.abridge`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from zoomr.schemas.checks import AT_LEAST_ONE, BETA, FRACTION, NON_NEGATIVE, POSITIVE, check_fields
from zoomr.schemas.sft import check_length

# where the block-masked forward's mask lives (zoomr.abridge.mask): auto = flex on CUDA, chunked elsewhere
MASK_BACKENDS = ("auto", "dense", "flex", "chunked")


@dataclass
class AbridgeOptim:
    """AdamW + the paper's warm-up / constant / linear-decay schedule (AbridgeKV appendix "training")."""

    learning_rate: float = 1.0e-4  # paper: 1e-4 peak
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    weight_decay: float = 0.1
    max_grad_norm: float = 1.0
    warmup_fraction: float = 0.03
    decay_start_fraction: float = 0.8
    final_lr_fraction: float = 0.1

    def __post_init__(self) -> None:
        check_fields(self, "method.optim", learning_rate=POSITIVE, adam_beta1=BETA, adam_beta2=BETA,
                     weight_decay=NON_NEGATIVE, max_grad_norm=POSITIVE, warmup_fraction=FRACTION,
                     decay_start_fraction=FRACTION, final_lr_fraction=FRACTION)  # fmt: skip
        if self.warmup_fraction > self.decay_start_fraction:
            raise ValueError(f"method.optim: warmup_fraction={self.warmup_fraction} must be <= "
                             f"decay_start_fraction={self.decay_start_fraction} (the decay starts after the warm-up)")  # fmt: skip


@dataclass
class MaskedTraining:
    """What every one-forward masked full fine-tuning run needs (AbridgeKV, LightThinker): data limits,
    the optimiser and the ``Trainer`` loop."""

    init_from: str | None = None  # a checkpoint directory to start from (default: the model config)
    max_prompt_tokens: int = 512  # longer prompts are skipped (and counted), never truncated
    max_response_tokens: int = 512  # responses are truncated to this many tokens
    # the first N examples are held out (AbridgeKV: the first 192 pairs); >= 1: the run ends with its held-out CE
    # (and LightThinker's served sample) on them (0 reported a CE of 0, or crashed after training in LightThinker)
    heldout_examples: int = 4
    optim: AbridgeOptim = field(default_factory=AbridgeOptim)
    max_steps: int = 100
    per_device_batch_size: int = 4
    gradient_accumulation_steps: int = 1
    logging_steps: int = 10
    eval_steps: int = 50  # 0: no held-out evaluation during training
    save_steps: int = 50
    save_total_limit: int = 2
    bf16: bool = False
    gradient_checkpointing: bool = False
    mask_backend: str = "auto"  # auto (flex on CUDA, chunked elsewhere) | chunked | dense | flex

    # the fields only the trainer reads: they do not decide a served result row (zoomr.cache.registry.serving_settings)
    TRAINING_ONLY: ClassVar[tuple[str, ...]] = (
        "init_from", "max_prompt_tokens", "max_response_tokens", "heldout_examples", "optim", "max_steps",
        "per_device_batch_size", "gradient_accumulation_steps", "logging_steps", "eval_steps", "save_steps",
        "save_total_limit", "bf16", "gradient_checkpointing", "mask_backend",
    )  # fmt: skip

    def __post_init__(self) -> None:
        check_length(type(self).__name__, self.max_steps)
        check_fields(self, "method", max_prompt_tokens=AT_LEAST_ONE, max_response_tokens=AT_LEAST_ONE,
                     heldout_examples=AT_LEAST_ONE, per_device_batch_size=AT_LEAST_ONE,
                     gradient_accumulation_steps=AT_LEAST_ONE, logging_steps=AT_LEAST_ONE, eval_steps=NON_NEGATIVE,
                     save_steps=AT_LEAST_ONE, save_total_limit=AT_LEAST_ONE)  # fmt: skip
        check_mask_backend(self.mask_backend)


@dataclass
class AbridgeAllocateMethod:
    """Halve each layer's quota in turn on a trained uniform model; write a three-level schedule."""

    name: str = "abridge_allocate"
    trainer: str = "abridge_allocate"
    checkpoint: str = "runs/train/abridge-tiny-qwen2-traces/final"  # a +method=abridge run's final/
    heldout_examples: int | None = None  # null: as the checkpoint was trained
    batch_size: int = 4
    mask_backend: str = "auto"

    def __post_init__(self) -> None:
        check_fields(self, "method", heldout_examples=AT_LEAST_ONE, batch_size=AT_LEAST_ONE)
        check_mask_backend(self.mask_backend)


SCHEMAS = [
    ("method", "abridge_allocate", AbridgeAllocateMethod),
]


def check_mask_backend(backend: str) -> None:
    if backend not in MASK_BACKENDS:
        raise ValueError(f"method.mask_backend must be {'|'.join(MASK_BACKENDS)}, got {backend!r}")
