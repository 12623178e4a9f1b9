"""The hooks a KV-cache policy overrides (:class:`PolicyHooks`), and how to write a policy.

How to write a policy
=====================
A policy is one file in ``zoomr/cache/`` with its config dataclass (a :class:`~zoomr.cache.config.PolicyConfig`)
and a subclass of :class:`~zoomr.cache.base.PolicyCache`, registered together, plus one
``conf/method/<name>.yaml`` (the README's "Add a method" has a complete one)::

    @register_policy("mine", MineConfig)
    class MineCache(PolicyCache):
        def after_attention(self, layer):                  # per layer, once this step's attention is done
            if layer.store.n.max() > self.config.budget_rows:
                rows = layer.store.rows()                   # padded per-(b, h) view, rows in insertion order
                keep = ...                                  # bool [B, H, N] aligned with ``rows``
                with self.selecting():                      # time counted as "selection" in the stats
                    self.evict(layer.idx, keep)             # compacts in place: evicted rows are freed

The cache is an ordinary ``Cache``: ``model(..., cache=policy)`` and ``model.generate(cache=policy)`` (batch 1)
work, and :func:`zoomr.engine.generate` runs batches. Load the model with ``attn_implementation="zoomr"``
(:mod:`zoomr.attention`): our attention function builds the per-(b, head) mask of ragged rows and calls the hooks.

Storage
-------
Each layer (:class:`PolicyLayer`) owns a :class:`~zoomr.cache.store.PagedKV`: rows per (sequence b, KV head h),
in contiguous buffers (attention reads views; exact pages when heads hold very uneven rows), in insertion order, each with its RoPE position ``pos`` and feed index ``order``. Keys are stored
**post-RoPE**, so a kept row keeps its original position; a new token gets its sequence's true next position
(``logical length``, counted over that sequence's own non-pad tokens). Pads of a left-padded prompt are never
stored. ``get_seq_length()`` is the LOGICAL length; ``get_mask_sizes`` / ``get_query_offset`` are PHYSICAL.

Semantics of ``update()`` (called by the attention module of layer l)
--------------------------------------------------------------------
1. append this step's rows (valid tokens only) to layer l's store;
2. call ``on_append(layer)`` — evicting here means the current queries no longer see those rows;
3. return the padded rows (all resident rows, including the new ones) for attention.
Then the attention function calls ``on_queries(layer, q)`` (post-RoPE queries ``[B, H_q, S, d]``), computes
attention with the ragged mask (eagerly when ``wants_attention_weights(layer)`` is true, then
``on_attention(layer, weights [B, H_q, S, N])``), and ``after_attention(layer)`` — evicting here means the
current token saw everything and later tokens see the kept set. After the whole forward the engine calls
``on_step_end(step)``; policies that decide across layers (one kept set for all layers) evict there.
``on_step_begin(step)`` runs when a forward is declared (``begin_step``), before any layer.
A budget therefore counts the rows resident *between* steps.

The step protocol (``begin_step`` / ``update`` / ``end_step``) is the base's and closed: a subclass that overrides
it is refused at class creation; policies react in the hooks.

Hooks (all optional, all take the :class:`PolicyLayer` or :class:`Step`): ``on_step_begin``, ``on_attention_input`` (the
attention module's input hidden states, before ``update``; set ``wants_attention_input``), ``on_append``, ``on_queries``,
``hidden_rows`` (held rows some of this step's queries must not see),
``wants_attention_weights`` + ``on_attention``, ``after_attention``, ``on_step_end``, ``forced_inputs`` (extra
tokens to run for a sequence before its next sampled token, e.g. pause tokens), ``next_positions``
(RoPE positions of new tokens; StreamingLLM's re-rotation overrides it), ``attach(model)`` (model-level
hooks a policy needs, installed by the engine for the run). Per-row state that must follow the
rows through evictions (e.g. accumulated attention) is declared in ``row_attrs`` and lives in the store.

Context available in hooks: ``self.step`` (:class:`Step`: this forward's ``input_ids``, ``positions``, feed
``order``, ``valid``, ``is_prefill`` / ``ends_prefill``), ``self.lengths`` (logical length per sequence),
``self.fed`` (tokens fed, forced included), ``self.prompt_lengths``, ``self.tokenizer``; per-layer free state in
``layer.state`` (reindex it in ``on_select_batch`` when finished sequences leave the batch). Store helpers:
``store.rows()``, ``store.attr(name)`` / ``add_to_attr``, ``store.n``; row j of (b, h) is its j-th row in
insertion order. A policy whose full cache lives on host (offload, ZoomR) subclasses
:class:`zoomr.cache.offload.HostRowsMixin` and says which held rows attention needs (``attended_rows``); the
mixin gathers, copies and prefetches them.
A policy that must run without the ``"zoomr"`` attention is refused at the end of the step (loud error).

Modules: :mod:`~zoomr.cache.step` (step records and the step protocol), :mod:`~zoomr.cache.eviction` (evicting
and timing), :mod:`~zoomr.cache.base` (the ``transformers.Cache`` adapter), :mod:`~zoomr.cache.stats`.
Stats: ``resident_rows()`` ``[L, B, H]``, ``resident_bytes()`` ``{"device", "host"}`` from the tensors held,
``logical_lengths()``, ``pop_select_seconds()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch

if TYPE_CHECKING:
    from zoomr.cache.base import PolicyLayer
    from zoomr.cache.step import ForcedInput, Step


class PolicyHooks:
    """The overridable part of :class:`~zoomr.cache.base.PolicyCache`: every hook is a no-op by default."""

    def on_step_begin(self, step: Step) -> None:
        """A forward was declared (``self.step`` is set, lengths and feed indices advanced), before any layer
        runs. ZoomR reads the fed tokens here."""

    def on_append(self, layer: PolicyLayer) -> None:
        """After this step's rows were appended to ``layer``, before its attention."""

    wants_attention_input: ClassVar[bool] = False  # True: the engine calls on_attention_input (forward pre-hooks)

    def on_attention_input(self, layer_idx: int, hidden_states: torch.Tensor) -> None:
        """The attention module's input hidden states ``[B, S, D]`` of this step, before ``update`` of that layer
        (e.g. KVzap scores new tokens from them). Called by :func:`zoomr.engine.generate` only."""

    def on_queries(self, layer: PolicyLayer, query: torch.Tensor) -> None:
        """Post-RoPE queries of this step at ``layer``: ``[B, H_q, S, d]`` (pads included; see ``self.step.valid``)."""

    def hidden_rows(self, layer: PolicyLayer) -> torch.Tensor | None:
        """Rows this step's queries must not see although they are held: bool ``[B, H, S, N]`` over
        ``layer.view`` (True = hidden), or None. LightThinker hides a thought from its ``<|continue|>``
        token, fed in the same forward as the thought's cache tokens, which do see it."""
        return None

    def wants_attention_weights(self, layer: PolicyLayer) -> bool:
        """Return True to get ``on_attention`` with the softmax weights (computed eagerly, costs memory)."""
        return False

    def on_attention(self, layer: PolicyLayer, weights: torch.Tensor) -> None:
        """Softmax weights ``[B, H_q, S, N]`` over ``layer.view``'s rows (0 on masked rows and pad queries)."""

    def after_attention(self, layer: PolicyLayer) -> None:
        """After ``layer``'s attention of this step (``layer.view`` is still set)."""

    def on_step_end(self, step: Step) -> None:
        """After the whole forward of ``step`` (every layer done)."""

    def forced_inputs(self, sampled: list[int | None]) -> dict[int, ForcedInput]:
        """After sampling (``sampled[b]`` is the token just drawn for sequence b, None if none): extra tokens to
        run before each sequence's next sampled token. Keys are batch rows of the current step."""
        return {}

    def attach(self, model: torch.nn.Module) -> list[Any]:
        """Called by the engine with the model before the first forward; returns removable handles (removed
        after the run). By default installs forward pre-hooks on every attention module that feed
        :meth:`on_attention_input` when ``wants_attention_input`` is set; override (calling super) for policies
        that read the model itself. With stock ``model.generate`` call it yourself."""
        if not self.wants_attention_input:
            return []

        def hook(module, args, kwargs):
            hidden = kwargs.get("hidden_states", args[0] if args else None)
            self.on_attention_input(module.layer_idx, hidden)

        return [
            module.register_forward_pre_hook(hook, with_kwargs=True)
            for module in model.modules()
            if hasattr(module, "layer_idx") and hasattr(module, "o_proj")
        ]

    def next_positions(self, valid: torch.Tensor) -> torch.Tensor:
        """RoPE positions for new tokens ``valid [B, S]``: each sequence continues its own logical length."""
        base = self.lengths if self.lengths is not None else torch.zeros(valid.shape[0], dtype=torch.long)
        base = base.to(valid.device)[:, None]
        if valid.shape[1] == 1:  # one token per sequence: its position is the length (0 where invalid)
            return base * valid
        rank = torch.cumsum(valid.long(), dim=1) - 1
        return (base + rank).clamp_min(0) * valid

    def on_select_batch(self, index: torch.Tensor) -> None:
        """Hook: reindex any per-sequence policy state when the batch shrinks."""
