"""Schema of LightThinker training and serving (``+method=lightthinker``; METHODS.md "Baselines")."""

from __future__ import annotations

from dataclasses import dataclass

from zoomr.schemas.abridge import MaskedTraining


@dataclass
class LightThinkerMethod(MaskedTraining):
    """LightThinker: after each thought the model emits ``<|splitter|>``; n cache tokens and
    ``<|continue|>`` run, then the thought's and the splitter's KV are freed.

    ``num_cache_tokens``: n (null = the paper's rule by architecture: 9 for Qwen, 7 for Llama).
    ``min_thought_chars``: paragraphs shorter than this are merged into the next one (0 = every
    blank-line paragraph is a thought, the paper's segmentation).
    ``mask_backend``: auto (FlexAttention BlockMask on CUDA, dense mask + SDPA elsewhere) | dense | flex.
    The data limits, optimiser, schedule and loop fields are AbridgeKV's (:class:`MaskedTraining`), so the
    two arms train alike; ``init_from`` starts from a checkpoint (a testbed model, an SFT model).
    """

    name: str = "lightthinker"
    trainer: str = "lightthinker"
    policy: str = "lightthinker"  # the serving policy in zoomr.cache (python -m eval +method=lightthinker)
    page_size: int = 16  # serving: rows per storage page
    layout_from_checkpoint: bool = True  # serving: the checkpoint's lightthinker.json wins
    allow_untrained: bool = False  # serving: run on a model without lightthinker.json (smoke tests, not results)
    num_cache_tokens: int | None = None
    min_thought_chars: int = 0


SCHEMAS = [("method", "lightthinker", LightThinkerMethod)]
