"""Schemas of AbridgeKV training (``+method=abridge``) and layer allocation (``+method=abridge_allocate``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from zoomr.schemas.sft import check_length


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


@dataclass
class MaskedTraining:
    """What every one-forward masked full fine-tuning run needs (AbridgeKV, LightThinker): data limits,
    the optimiser and the ``Trainer`` loop."""

    init_from: str | None = None  # a checkpoint directory to start from (default: the model config)
    max_prompt_tokens: int = 512  # longer prompts are skipped (and counted), never truncated
    max_response_tokens: int = 512  # responses are truncated to this many tokens
    heldout_examples: int = 4  # the first N examples are held out (AbridgeKV: the first 192 pairs)
    optim: AbridgeOptim = field(default_factory=AbridgeOptim)
    max_steps: int = 100
    per_device_batch_size: int = 4
    gradient_accumulation_steps: int = 1
    logging_steps: int = 10
    eval_steps: int = 50
    save_steps: int = 50
    save_total_limit: int = 2
    bf16: bool = False
    gradient_checkpointing: bool = False
    mask_backend: str = "auto"  # auto (flex on CUDA, dense elsewhere) | dense | flex

    def __post_init__(self) -> None:
        check_length(type(self).__name__, self.max_steps)


@dataclass
class AbridgeMethod(MaskedTraining):
    """AbridgeKV: pause tokens after every completed block, block-masked full fine-tuning, per-layer quotas.

    ``quota``: uniform code rows kept per layer and block (null = num_pause // 2); ``schedule``: a
    per-layer quota file (from ``+method=abridge_allocate``), which wins over ``quota``.
    ``code_positions``: spread | tail (inside the replaced span) | appended (the paper's ablation).
    ``mask_backend``: auto (FlexAttention BlockMask on CUDA, dense mask + SDPA elsewhere) | dense | flex.
    """

    name: str = "abridge"
    trainer: str = "abridge"
    policy: str = "abridge"  # the serving policy in zoomr.cache (python -m eval +method=abridge)
    page_size: int = 16  # serving: rows per storage page
    layout_from_checkpoint: bool = True  # serving: a checkpoint's abridge.json wins over the fields below
    allow_untrained: bool = False  # serving: run on a model without abridge.json (smoke tests, not results)
    block_size: int = 64  # C
    num_pause: int = 16  # K_max: pause tokens (code rows) written per completed block
    quota: int | None = None
    schedule: str | None = None
    code_positions: str = "spread"
    # after training on the recall testbed from ``init_from``: greedy held-out accuracy of this model vs full
    # KV (the start model) vs StreamingLLM at this model's rows, through the evaluator (0 = skip)
    testbed_eval_problems: int = 64


@dataclass
class AbridgeAllocateMethod:
    """Halve each layer's quota in turn on a trained uniform model; write a three-level schedule."""

    name: str = "abridge_allocate"
    trainer: str = "abridge_allocate"
    checkpoint: str = "runs/train/abridge-tiny-qwen2-traces/final"  # a +method=abridge run's final/
    heldout_examples: int | None = None  # null: as the checkpoint was trained
    batch_size: int = 4
    mask_backend: str = "auto"


SCHEMAS = [
    ("method", "abridge", AbridgeMethod),
    ("method", "abridge_allocate", AbridgeAllocateMethod),
]
