"""AbridgeKV serving policy (AbridgeKV §3, appendix E "serving"): learned code rows replace each block.

When a sequence's C-th token of a block has been sampled, the policy asks the engine (``forced_inputs``)
to feed ``[that token, <|pause_0|> … <|pause_{K-1}|>]`` in the next forward — alongside other sequences'
ordinary decode tokens — at the code-row positions of :mod:`zoomr.abridge.layout`, and to sample the next
token from the last pause token's output. After that forward's attention at layer ℓ (the pause tokens saw
the block's raw rows), the layer keeps the first q_ℓ pause rows as the block's code rows and frees the
block's C raw rows and the other pause rows: physically, layer by layer, each layer's store holding only
its own quota (no padding to the largest). The prompt and the open block stay raw.

Which rows stay is read off each row's feed index with :func:`zoomr.abridge.layout.roles_from_order` —
the same stream the trainer's block mask is built from — so trainer and server compute one function.

Layout and quotas: explicit ``layout=`` / ``quotas=`` arguments win; else, when the model was loaded from
an AbridgeKV checkpoint (``abridge.json`` next to its weights) and ``layout_from_checkpoint`` is set, the
checkpoint's; else the config's (``block_size``, ``num_pause``, ``code_positions``, ``quota``/``schedule``).
A model without ``abridge.json`` was never trained to write code rows (it would emit pause tokens it never
learned), so building the policy for it is refused unless a layout is passed or ``allow_untrained`` is set.
Runs with :func:`zoomr.engine.generate` (stock ``model.generate`` has no forced-token hook).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from zoomr.abridge.artifacts import FILENAME, load_abridge_config
from zoomr.abridge.layout import (
    PAUSE,
    PROMPT,
    RAW,
    AbridgeLayout,
    block_start,
    pause_token_ids,
    roles_from_order,
)
from zoomr.abridge.quotas import check_quotas, resolve_quotas
from zoomr.cache.base import ForcedInput, PolicyCache, PolicyLayer
from zoomr.cache.config import fill_names
from zoomr.cache.registry import register_policy
from zoomr.schemas.abridge import MaskedTraining
from zoomr.schemas.checks import AT_LEAST_ONE, NON_NEGATIVE, check_fields

log = logging.getLogger(__name__)


@dataclass
class AbridgeMethod(MaskedTraining):
    """AbridgeKV: pause tokens after every completed block, block-masked full fine-tuning, per-layer quotas.

    ``quota``: uniform code rows kept per layer and block (null = num_pause // 2); ``schedule``: a
    per-layer quota file (from ``+method=abridge_allocate``); a config gives one of them, not both.
    ``code_positions``: spread | tail (inside the replaced span) | appended (the paper's ablation).
    ``mask_backend``: auto (FlexAttention BlockMask on CUDA, chunked SDPA elsewhere) | chunked | dense | flex.
    """

    name: str = ""  # the run's label ("" = the policy's name, filled by fill_names)
    trainer: str = "abridge"
    policy: str = ""  # the serving policy (python -m eval +method=abridge), filled by fill_names
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
    TRAINING_ONLY: ClassVar[tuple[str, ...]] = (*MaskedTraining.TRAINING_ONLY, "trainer", "testbed_eval_problems")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_fields(self, "method", page_size=AT_LEAST_ONE, testbed_eval_problems=NON_NEGATIVE)
        if self.schedule and self.quota is not None:  # the schedule would silently win over the quota asked for
            raise ValueError(
                f"method.quota={self.quota} and method.schedule={self.schedule}: give one of them "
                "(method.schedule=null for a uniform quota, method.quota=null for the schedule)"
            )
        try:
            AbridgeLayout(self.block_size, self.num_pause, self.code_positions)  # refuses impossible C, K, positions
        except ValueError as e:
            raise ValueError(f"method: {e}") from None
        if self.quota is not None and not 0 <= self.quota <= self.num_pause:
            raise ValueError(f"method.quota={self.quota} must lie in [0, method.num_pause={self.num_pause}]")
        fill_names(self)


def abridge_keep(
    order: torch.Tensor,
    prompt_len: torch.Tensor,
    fed: torch.Tensor,
    layout: AbridgeLayout,
    quota: int,
) -> torch.Tensor:
    """``[B, H, N]`` rows to keep at a layer of quota ``quota``, given ``fed [B]`` stream tokens fed so far:
    the prompt, raw rows of blocks whose pause tokens have not run yet, and code slots ``< quota``."""
    kind, block, slot = roles_from_order(order, prompt_len, layout)
    period = layout.block_size + layout.num_pause
    compressed = torch.div(fed - prompt_len, period, rounding_mode="floor").to(order.device)  # blocks done
    open_raw = (kind == RAW) & (block >= compressed[:, None, None])
    return (kind == PROMPT) | open_raw | ((kind == PAUSE) & (slot < quota))


def checkpoint_layout(model_config) -> tuple[AbridgeLayout, list[int]] | None:
    path = getattr(model_config, "_name_or_path", None)
    if path and (Path(path) / FILENAME).exists():
        layout, quotas, _ = load_abridge_config(path)
        return layout, quotas
    return None


_SAID: set[tuple] = set()  # (checkpoint, layout, quotas) announced in this process


@register_policy("abridge", AbridgeMethod)
class AbridgeCache(PolicyCache):
    def __init__(
        self,
        config: AbridgeMethod,
        model_config,
        tokenizer=None,
        layout: AbridgeLayout | None = None,
        quotas: list[int] | None = None,
    ) -> None:
        super().__init__(config, model_config, tokenizer)
        found = checkpoint_layout(self.model_config)
        saved = found if config.layout_from_checkpoint else None
        if layout is None and found is None and not config.allow_untrained:
            where = getattr(self.model_config, "_name_or_path", None) or "the model"
            raise ValueError(
                f"abridge policy: {where} has no {FILENAME}, so it is not an AbridgeKV checkpoint and never "
                "learned to write code rows. Evaluate a trained one (python -m train +method=abridge, then "
                "model.hf_id=runs/train/abridge-<model>-<data>/final), or set method.allow_untrained=true "
                "to run the config's layout on this model anyway (a smoke test, not a result)"
            )
        self.from_checkpoint = saved is not None and layout is None and quotas is None
        if layout is None:
            layout = (
                saved[0]
                if saved
                else AbridgeLayout(config.block_size, config.num_pause, config.code_positions)
            )
        if quotas is None:
            quotas = (
                saved[1]
                if saved
                else resolve_quotas(self.num_layers, layout.num_pause, config.quota, config.schedule)
            )
        self.layout = layout
        self.quotas = check_quotas(quotas, self.num_layers, layout.num_pause)
        if tokenizer is None:
            raise ValueError("the abridge policy needs the tokenizer (its pause token ids)")
        self.pause_ids = pause_token_ids(tokenizer, layout.num_pause)
        self.prompt_len: torch.Tensor | None = None  # [B] stream tokens of the prompt
        self.generated: torch.Tensor | None = None  # [B] response tokens sampled so far
        self.compacting = False  # this forward carries some sequence's pause tokens
        said = (getattr(self.model_config, "_name_or_path", None), repr(layout), tuple(self.quotas))
        if saved and said not in _SAID:  # once per checkpoint: the evaluator builds a cache for every batch
            _SAID.add(said)
            log.info("abridge: layout %s and quotas %s from the checkpoint", layout, self.quotas)

    def ignored_settings(self, fields: set[str]) -> list[str]:
        """The layout fields among ``fields`` whose values the checkpoint's ``abridge.json`` replaced
        (``layout_from_checkpoint``): C, K, code positions, and the quotas ``quota`` / ``schedule`` resolve to."""
        if not self.from_checkpoint:
            return []
        c, lay = self.config, self.layout
        served = {"block_size": lay.block_size, "num_pause": lay.num_pause, "code_positions": lay.code_positions}
        out = [f"method.{k}={getattr(c, k)!r} (the checkpoint serves {v!r})"
               for k, v in served.items() if k in fields and getattr(c, k) != v]  # fmt: skip
        if fields & {"quota", "schedule"}:
            try:
                asked = resolve_quotas(self.num_layers, lay.num_pause, c.quota, c.schedule)
            except ValueError:  # e.g. a quota above the checkpoint's K
                asked = None
            if asked != self.quotas:
                key = "schedule" if c.schedule else "quota"
                out.append(f"method.{key}={getattr(c, key)!r} (the checkpoint serves quotas {self.quotas})")
        return out

    def forced_inputs(self, sampled: list[int | None]) -> dict[int, ForcedInput]:
        if self.prompt_len is None:  # first call: the prefill has just ended
            self.prompt_len = self.fed.clone()
            self.generated = torch.zeros_like(self.fed)
        forced = {}
        C = self.layout.block_size
        for b, tok in enumerate(sampled):
            if tok is None:
                continue
            self.generated[b] += 1
            n = int(self.generated[b])
            if n % C == 0:  # block n/C - 1 is complete: write its code rows in the next forward
                start = block_start(self.layout, int(self.prompt_len[b]), n // C - 1)
                forced[b] = ForcedInput(
                    list(self.pause_ids), positions=self.layout.pause_positions(start), sample_from_last=True
                )
        self.compacting = bool(forced)
        return forced

    def after_attention(self, layer: PolicyLayer) -> None:
        if not self.compacting or self.step is None or self.step.is_prefill:
            return
        store = layer.store
        with self.selecting():
            flat, valid = store.flat_index()
            order = store.order.view(-1)[flat].where(valid, torch.full_like(flat, -1))
            keep = abridge_keep(order, self.prompt_len, self.fed, self.layout, self.quotas[layer.idx])
            self.evict(layer.idx, keep & valid)

    def on_step_end(self, step) -> None:
        if not step.is_prefill:
            self.compacting = False

    def on_select_batch(self, index: torch.Tensor) -> None:
        if self.prompt_len is not None:
            self.prompt_len = self.prompt_len[index.to(self.prompt_len.device)]
            self.generated = self.generated[index.to(self.generated.device)]
