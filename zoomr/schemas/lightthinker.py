"""Schema of LightThinker training and serving (``+method=lightthinker``; METHODS.md "Baselines")."""

from __future__ import annotations

from dataclasses import dataclass, field

from zoomr.schemas.abridge import AbridgeOptim


@dataclass
class LightThinkerMethod:
    """LightThinker: after each thought the model emits ``<|splitter|>``; n cache tokens and
    ``<|continue|>`` run, then the thought's and the splitter's KV are freed.

    ``num_cache_tokens``: n (null = the paper's rule by architecture: 9 for Qwen, 7 for Llama).
    ``min_thought_chars``: paragraphs shorter than this are merged into the next one (0 = every
    blank-line paragraph is a thought, the paper's segmentation).
    ``mask_backend``: auto (FlexAttention BlockMask on CUDA, dense mask + SDPA elsewhere) | dense | flex.
    The optimiser and schedule are AbridgeKV's (``method.optim``), so the two arms train alike.
    """

    name: str = "lightthinker"
    trainer: str = "lightthinker"
    policy: str = "lightthinker"  # the serving policy in zoomr.cache (python -m eval +method=lightthinker)
    page_size: int = 16  # serving: rows per storage page
    layout_from_checkpoint: bool = True  # serving: the checkpoint's lightthinker.json wins
    num_cache_tokens: int | None = None
    min_thought_chars: int = 0
    mask_backend: str = "auto"
    init_from: str | None = None  # a checkpoint directory to start from (a testbed model, an SFT model)
    max_prompt_tokens: int = 512  # longer prompts are skipped (and counted), never truncated
    max_response_tokens: int = 512  # responses (splitters included) are truncated to this many tokens
    heldout_examples: int = 4
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


SCHEMAS = [("method", "lightthinker", LightThinkerMethod)]
