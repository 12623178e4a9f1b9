"""LightThinker serving policy (zjunlp/LightThinker; METHODS.md "Baselines"): compress each thought into
n cache tokens, then free the thought.

When a sequence samples ``<|splitter|>``, the policy asks the engine (``forced_inputs``) to feed
``[<|splitter|>, <|o_0|> … <|o_{n-1}|>, <|continue|>]`` in the next forward — alongside other sequences'
ordinary decode tokens — at the next logical positions, and to sample the next token from
``<|continue|>``'s output. In that forward the cache tokens see the prompt, the compressed history and
the current thought; ``<|continue|>`` must not see the thought (``hidden_rows``). After each layer's
attention, the thought's rows and the splitter's are freed physically; the cache and continue rows
stay. The prompt and the open thought stay raw.

This is the function :mod:`zoomr.lightthinker.mask` trains (the parity test checks it token by token).
n: an explicit ``num_cache_tokens=`` wins; else the checkpoint's ``lightthinker.json`` (when
``layout_from_checkpoint``); else the config's ``num_cache_tokens``; else the paper's value for the
architecture (9 Qwen, 7 Llama). A model without ``lightthinker.json`` never learned to write the splitter,
so building the policy for it is refused unless n is passed or ``allow_untrained`` is set. Runs with :func:`zoomr.engine.generate` (stock ``model.generate`` has
no forced-token hook).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from zoomr.cache.base import ForcedInput, PolicyCache, PolicyLayer
from zoomr.cache.config import fill_names
from zoomr.cache.registry import register_policy
from zoomr.lightthinker.layout import FILENAME, ThoughtTokens, checkpoint_cache_tokens, paper_cache_tokens
from zoomr.paths import MissingInput
from zoomr.schemas.abridge import MaskedTraining
from zoomr.schemas.checks import AT_LEAST_ONE, NON_NEGATIVE, check_fields


@dataclass
class LightThinkerMethod(MaskedTraining):
    """LightThinker: after each thought the model emits ``<|splitter|>``; n cache tokens and
    ``<|continue|>`` run, then the thought's and the splitter's KV are freed.

    ``num_cache_tokens``: n (null = the paper's rule by architecture: 9 for Qwen, 7 for Llama).
    ``min_thought_chars``: paragraphs shorter than this are merged into the next one (0 = every
    blank-line paragraph is a thought, the paper's segmentation).
    ``mask_backend``: auto (FlexAttention BlockMask on CUDA, chunked SDPA elsewhere) | chunked | dense | flex.
    The data limits, optimiser, schedule and loop fields are AbridgeKV's (:class:`MaskedTraining`), so the
    two arms train alike; ``init_from`` starts from a checkpoint (a testbed model, an SFT model).
    """

    name: str = ""  # the run's label ("" = the policy's name, filled by fill_names)
    trainer: str = "lightthinker"
    policy: str = ""  # the serving policy (python -m eval +method=lightthinker), filled by fill_names
    page_size: int = 16  # serving: rows per storage page
    layout_from_checkpoint: bool = True  # serving: the checkpoint's lightthinker.json wins
    allow_untrained: bool = False  # serving: run on a model without lightthinker.json (smoke tests, not results)
    num_cache_tokens: int | None = None
    min_thought_chars: int = 0
    TRAINING_ONLY: ClassVar[tuple[str, ...]] = (*MaskedTraining.TRAINING_ONLY, "trainer")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_fields(self, "method", page_size=AT_LEAST_ONE, num_cache_tokens=AT_LEAST_ONE,
                     min_thought_chars=NON_NEGATIVE)  # fmt: skip
        fill_names(self)


def resolve_cache_tokens(config: LightThinkerMethod, model_config, explicit: int | None = None) -> int:
    """n by precedence: explicit, checkpoint record, config, paper rule by architecture. Without an explicit
    n, a model that is not a LightThinker checkpoint is refused unless ``allow_untrained``."""
    if explicit is not None:
        return explicit
    found = checkpoint_cache_tokens(model_config)
    if found is None and not config.allow_untrained:
        where = getattr(model_config, "_name_or_path", None) or "the model"
        raise MissingInput(
            f"lightthinker policy: {where} has no {FILENAME}, so it is not a LightThinker checkpoint and never "
            "learned to write <|splitter|> (it would decode as full KV). Evaluate a trained one (python -m train "
            "+method=lightthinker, then model.hf_id=runs/train/lightthinker-<model>-<data>/final), or set "
            "method.allow_untrained=true to run on this model anyway (a smoke test, not a result)"
        )
    saved = found if config.layout_from_checkpoint else None
    if saved is not None and config.num_cache_tokens not in (None, saved):  # the checkpoint's n won without a word
        raise ValueError(
            f"lightthinker policy: method.num_cache_tokens={config.num_cache_tokens}, but "
            f"{model_config._name_or_path}/{FILENAME} was trained with {saved} cache tokens, which serving uses; "
            f"leave method.num_cache_tokens=null (or {saved}), or set method.layout_from_checkpoint=false to serve "
            "with another n"
        )
    if saved is not None:
        return saved
    if config.num_cache_tokens is not None:
        return config.num_cache_tokens
    return paper_cache_tokens(getattr(model_config, "model_type", ""))


@register_policy("lightthinker", LightThinkerMethod)
class LightThinkerCache(PolicyCache):
    def __init__(
        self, config: LightThinkerMethod, model_config, tokenizer=None, num_cache_tokens: int | None = None
    ) -> None:
        super().__init__(config, model_config, tokenizer)
        if tokenizer is None:
            raise ValueError("the lightthinker policy needs the tokenizer (its splitter and cache token ids)")
        n = resolve_cache_tokens(config, self.model_config, num_cache_tokens)
        self.tt = ThoughtTokens.from_tokenizer(tokenizer, n)
        self.thought_start: torch.Tensor | None = None  # [B] feed index of the open thought's first token
        self.splitter_at: torch.Tensor | None = None  # [B] feed index of the splitter closing now, -1 if none
        self.thoughts_freed: torch.Tensor | None = None  # [B] thoughts compressed so far

    def forced_inputs(self, sampled: list[int | None]) -> dict[int, ForcedInput]:
        if self.thought_start is None:  # first call: the prefill has just ended
            self.thought_start = self.fed.clone()
            self.thoughts_freed = torch.zeros_like(self.fed)
        closing = torch.tensor([t == self.tt.splitter for t in sampled], device=self.fed.device)
        self.splitter_at = torch.where(closing, self.fed, -1)  # the pending splitter is fed next, here
        feed = [*self.tt.cache, self.tt.cont]
        return {b: ForcedInput(list(feed), sample_from_last=True) for b in closing.nonzero()[:, 0].tolist()}

    def _thought_rows(self, order: torch.Tensor) -> torch.Tensor:
        """``[B, H, N]``: rows of a thought closing in this step (its tokens and its splitter)."""
        shape = (-1,) + (1,) * (order.dim() - 1)
        start, end = self.thought_start.view(shape), self.splitter_at.view(shape)
        return (end >= 0) & (order >= start) & (order <= end)

    def _closing_now(self) -> bool:
        step = self.step
        return (
            self.splitter_at is not None
            and step is not None
            and not step.is_prefill
            and bool((self.splitter_at >= 0).any())
        )

    def hidden_rows(self, layer: PolicyLayer) -> torch.Tensor | None:
        if not self._closing_now():
            return None
        rows = layer.view
        after_cache = self.step.order > (self.splitter_at + self.tt.n)[:, None]  # [B, S]: the continue token
        return self._thought_rows(rows.order)[:, :, None, :] & after_cache[:, None, :, None]

    def after_attention(self, layer: PolicyLayer) -> None:
        if not self._closing_now():
            return
        rows = layer.view
        with self.selecting():
            self.evict(layer.idx, rows.valid & ~self._thought_rows(rows.order))

    def on_step_end(self, step) -> None:
        if step.is_prefill or self.splitter_at is None:
            return
        closed = self.splitter_at >= 0
        self.thought_start = torch.where(closed, self.fed, self.thought_start)
        self.thoughts_freed = self.thoughts_freed + closed.long()
        self.splitter_at = torch.full_like(self.splitter_at, -1)

    def on_select_batch(self, index: torch.Tensor) -> None:
        if self.thought_start is not None:
            index = index.to(self.thought_start.device)
            self.thought_start = self.thought_start[index]
            self.thoughts_freed = self.thoughts_freed[index]
            self.splitter_at = self.splitter_at[index]
