"""What one forward feeds (:class:`Step`), tokens a policy asks for (:class:`ForcedInput`), and the step
protocol the engine drives (:class:`StepProtocol`: ``begin_step`` before each forward, ``end_step`` after).

The protocol is the cache base's own: it advances each sequence's logical length and feed index, records
the prompt lengths when the prefill ends, and calls the policy's ``on_step_begin`` / ``on_step_end`` hooks
(:mod:`zoomr.cache.hooks`). Policies never override it (:class:`~zoomr.cache.base.PolicyCache` refuses).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Step:
    """What one forward pass feeds: ``[B, S]`` tensors (S = 1 in plain decoding)."""

    index: int  # 0 = first forward (prefill or its first chunk)
    input_ids: torch.Tensor | None  # [B, S] (None when the caller did not say)
    positions: torch.Tensor  # [B, S] RoPE positions
    order: torch.Tensor  # [B, S] feed index in the sequence (-1 for invalid)
    valid: torch.Tensor  # [B, S] bool: pads / idle slots are False and never stored
    is_prefill: bool
    ends_prefill: bool = False  # the last (or only) prefill chunk: prompt-time policies (SnapKV) act here
    auto: bool = False  # opened by the cache itself (stock ``generate``), closed at the next step
    layers_done: set[int] = field(default_factory=set)
    all_valid: bool = False  # every slot of ``valid`` is True (computed once per step, read by every layer)
    pos_order: torch.Tensor | None = None  # [2, B, S] positions and order stacked (all-valid steps): one copy


@dataclass
class ForcedInput:
    """Tokens a policy asks the engine to run for one sequence before its next sampled token.

    The engine feeds ``[pending sampled token, *token_ids]`` in one forward. ``positions`` (default: the
    sequence's next logical positions) lets a method place them elsewhere (AbridgeKV puts code rows inside
    the block they replace). The next token is sampled from the pending token's output, or from the last
    forced token's output when ``sample_from_last`` (LightThinker's ``<|continue|>``).
    """

    token_ids: list[int]
    positions: list[int] | None = None
    sample_from_last: bool = False


class StepProtocol:
    """``begin_step`` / ``end_step`` of :class:`~zoomr.cache.base.PolicyCache` (state: ``lengths``, ``fed``,
    ``prompt_lengths``, ``step``, ``steps_done``, set up by its ``__init__``)."""

    def begin_step(
        self,
        valid: torch.Tensor,
        positions: torch.Tensor | None = None,
        input_ids: torch.Tensor | None = None,
        is_prefill: bool | None = None,
        ends_prefill: bool | None = None,
        auto: bool = False,
    ) -> Step:
        """Declare the next forward: ``valid [B, S]`` (False = pad / idle), optional RoPE ``positions``.

        ``is_prefill`` defaults to "first forward"; ``ends_prefill`` (default: ``is_prefill``) marks the
        last prefill chunk. The prompt length of each sequence is recorded when the prefill ends.
        """
        if self.step is not None and not self.step.auto:
            raise RuntimeError("begin_step called twice without end_step")
        if self.step is not None:
            self.end_step()
        valid = valid.bool()
        B = valid.shape[0]
        if self.lengths is None:
            self.lengths = torch.zeros(B, dtype=torch.long, device=valid.device)
            self.fed = torch.zeros(B, dtype=torch.long, device=valid.device)
        elif self.lengths.shape[0] != B:
            raise ValueError(f"step has batch {B}, cache holds {self.lengths.shape[0]} sequences")
        all_valid = bool(valid.all())
        if positions is None:
            positions = self.next_positions(valid)
        positions = positions.to(valid.device).long()
        fed = self.fed.to(valid.device)
        if all_valid and valid.shape[1] == 1:  # the plain decode step: one token each, fewest ops
            order = fed[:, None]
            self.fed = fed + 1
            top = positions[:, 0] + 1
        elif all_valid:  # no pads
            order = fed[:, None] + torch.arange(valid.shape[1], device=valid.device)
            self.fed = fed + valid.shape[1]
            top = positions.amax(dim=1) + 1
        else:
            rank = torch.cumsum(valid.long(), dim=1) - 1
            order = torch.where(valid, fed[:, None] + rank, torch.full_like(rank, -1))
            self.fed = fed + valid.sum(1)
            top = torch.where(valid, positions + 1, torch.zeros_like(positions)).amax(dim=1)
        self.lengths = torch.maximum(self.lengths.to(valid.device), top)
        prefill = self.steps_done == 0 if is_prefill is None else is_prefill
        self.step = Step(
            index=self.steps_done,
            input_ids=input_ids,
            positions=positions,
            order=order,
            valid=valid,
            is_prefill=prefill,
            ends_prefill=prefill if ends_prefill is None else ends_prefill,
            auto=auto,
            all_valid=all_valid,
            pos_order=torch.stack((positions, order)) if all_valid else None,
        )
        if self.step.ends_prefill:
            self.prompt_lengths = self.fed.clone()
        self.on_step_begin(self.step)
        return self.step

    def end_step(self) -> None:
        """Close the current forward: runs ``on_step_end`` (policies may evict across layers here)."""
        step, self.step = self.step, None
        if step is None:
            return
        missed = [i for i in sorted(step.layers_done) if not self.layers[i].attended]
        if missed:
            raise RuntimeError(
                f"{type(self).__name__}: layers {missed} did not run the policy attention, so the ragged mask and the "
                "policy hooks were skipped. Load the model with attn_implementation='zoomr' (zoomr.attention) or call "
                "zoomr.attention.use_policy_attention(model); zoomr.engine.generate switches it for you."
            )
        for layer in self.layers:
            layer.view = None
        self.on_step_end(step)
        self.steps_done += 1
