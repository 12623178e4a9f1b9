"""The KV-cache policy interface: a ``transformers.Cache`` whose layers hold ragged, really-freed rows.

How to write a policy
=====================
A policy is one file in ``zoomr/cache/`` with a subclass of :class:`PolicyCache`, registered by name, plus a
config dataclass (in ``zoomr/schemas/``) and one ``conf/method/<name>.yaml``::

    @register_policy("mine", config=MineConfig)
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
A budget therefore counts the rows resident *between* steps.

Hooks (all optional, all take the :class:`PolicyLayer` or :class:`Step`): ``on_attention_input`` (the
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
:class:`zoomr.cache.offload.HostRowsMixin` and overrides ``load_rows`` to bring only what attention needs.
A policy that must run without the ``"zoomr"`` attention is refused at the end of the step (loud error).

Stats: ``resident_rows()`` ``[L, B, H]``, ``resident_bytes()`` ``{"device", "host"}`` from the tensors held,
``logical_lengths()``, ``pop_select_seconds()``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from zoomr.attention import register_view
from zoomr.cache.store import PagedKV, Rows
from zoomr.memory import held_bytes

# --------------------------------------------------------------------------------------------- step records


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


# --------------------------------------------------------------------------------------------- layer


class PolicyLayer(CacheLayerMixin):
    """One model layer's rows (a :class:`PagedKV`), created lazily at the first ``update``."""

    is_compileable = False
    is_sliding = False
    is_croppable = False

    def __init__(self, idx: int, owner: PolicyCache) -> None:
        super().__init__()
        self.idx = idx
        self.store: PagedKV | None = None
        self.view: Rows | None = None  # rows handed to this step's attention (released after it)
        self.attended = False  # set by the policy attention when it consumed ``view`` this step
        self.state: dict[str, Any] = {}  # free per-layer policy state (tensors here count in resident bytes)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        raise NotImplementedError("PolicyCache creates its stores itself")

    def update(self, key_states, value_states, *args, **kwargs):
        raise NotImplementedError("call PolicyCache.update (the cache runs the policy hooks)")

    @property
    def n(self) -> torch.Tensor:
        return self.store.n if self.store is not None else torch.zeros(0, 0, dtype=torch.long)

    def num_rows(self) -> int:
        """Physical rows of the padded view (max over (b, h))."""
        return self.store.n_max if self.store is not None else 0

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.num_rows() + query_length, 0

    def get_seq_length(self) -> int:
        return self.num_rows()

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self.store, self.view, self.state = None, None, {}

    def offload(self) -> None:  # placement is the policy's business (see offload.py)
        pass

    def prefetch(self) -> None:
        pass


# --------------------------------------------------------------------------------------------- cache


class PolicyCache(Cache):
    """Base class of every KV-cache policy. Subclasses override hooks; the base keeps storage and bookkeeping.

    Args:
        config: the policy's hyperparameter dataclass (``zoomr/schemas/cache.py``).
        model_config: the model's ``PretrainedConfig`` (layers, heads, head dim, RoPE).
        tokenizer: optional, for policies that read the decoded text (semantic boundaries).
    """

    policy_name: ClassVar[str] = "base"
    config_class: ClassVar[type | None] = None
    row_attrs: ClassVar[tuple[str, ...]] = ()  # per-row float attributes kept in the stores
    store_role: ClassVar[str] = "device"  # where rows live between steps ("host": offloaded)
    _bytes_skip: ClassVar[tuple[str, ...]] = ("tokenizer", "model_config", "config")  # hold no KV tensors

    def __init__(self, config: Any, model_config: Any, tokenizer: Any = None) -> None:
        text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
        self.config = config
        self.model_config = text
        self.tokenizer = tokenizer
        self.num_layers = text.num_hidden_layers
        self.q_heads = text.num_attention_heads
        self.kv_heads = getattr(text, "num_key_value_heads", None) or self.q_heads
        self.head_dim = getattr(text, "head_dim", None) or text.hidden_size // self.q_heads
        self.group = self.q_heads // self.kv_heads
        self.page_size = int(getattr(config, "page_size", 16))
        super().__init__(layers=[PolicyLayer(i, self) for i in range(self.num_layers)])
        self.lengths: torch.Tensor | None = None  # [B] logical length per sequence
        self.fed: torch.Tensor | None = None  # [B] tokens fed per sequence (forced included)
        self.prompt_lengths: torch.Tensor | None = None  # [B] tokens fed when the prefill ended
        self.step: Step | None = None
        self.steps_done = 0
        self.compute_device: torch.device | None = None
        self.dtype: torch.dtype | None = None
        self._select_s = 0.0

    # ------------------------------------------------------------------ hooks (override in policies)
    def on_append(self, layer: PolicyLayer) -> None:
        """After this step's rows were appended to ``layer``, before its attention."""

    wants_attention_input: ClassVar[bool] = (
        False  # True: the engine calls on_attention_input (forward pre-hooks)
    )

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

    # ------------------------------------------------------------------ actions for policies
    def evict(self, layer_idx: int, keep: torch.Tensor) -> None:
        """Keep only some rows of ``layer_idx`` and free the rest.

        ``keep`` is a bool mask ``[B, H, N]`` aligned with ``layers[layer_idx].store.rows()`` (row j of (b, h) =
        its j-th row in insertion order), or a LongTensor ``[B, H, K]`` of row indices (-1 = padding).
        """
        store = self.layers[layer_idx].store
        if store is None:
            return
        if keep.dtype != torch.bool:
            idx = keep.to(store.device)
            mask = torch.zeros(
                store.batch, store.heads, int(store.n.max()) + 1, dtype=torch.bool, device=store.device
            )
            mask.scatter_(-1, idx.where(idx >= 0, mask.shape[-1] - 1), True)
            keep = mask[..., :-1]
        store.retain(keep)

    @contextmanager
    def selecting(self) -> Iterator[None]:
        """Time the enclosed selection work (synchronising CUDA so the time is real)."""
        sync = self.compute_device is not None and self.compute_device.type == "cuda"
        if sync:
            torch.cuda.synchronize(self.compute_device)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if sync:
                torch.cuda.synchronize(self.compute_device)
            self._select_s += time.perf_counter() - t0

    def new_store(
        self, batch: int, dtype: torch.dtype, device: torch.device, role: str | None = None
    ) -> PagedKV:
        role = role or self.store_role
        return PagedKV(
            batch,
            self.kv_heads,
            self.head_dim,
            dtype,
            device,
            self.page_size,
            role=role,
            pin=(role == "host"),
            attrs=self.row_attrs,
        )

    def store_device(self, compute_device: torch.device) -> torch.device:
        """Where the stores live (the compute device; offloading policies return the host)."""
        return compute_device

    # ------------------------------------------------------------------ step protocol (engine)
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

    # ------------------------------------------------------------------ transformers Cache API
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Append this step's rows, run ``on_append``, return the padded resident rows ``[B, H, N, d]``."""
        step = self.step
        if step is None or (step.auto and layer_idx in step.layers_done):
            B, _, S, _ = key_states.shape  # stock generate / plain forward: every token valid
            step = self.begin_step(torch.ones(B, S, dtype=torch.bool, device=key_states.device), auto=True)
        if key_states.shape[2] != step.valid.shape[1]:
            raise ValueError(
                f"layer {layer_idx}: {key_states.shape[2]} new tokens, step declared {step.valid.shape[1]}"
            )
        layer = self.layers[layer_idx]
        if layer.store is None:
            self.compute_device, self.dtype = key_states.device, key_states.dtype
            layer.store = self.new_store(
                key_states.shape[0], key_states.dtype, self.store_device(key_states.device)
            )
        layer.store.append(
            key_states, value_states, step.positions, step.order, step.valid, all_valid=step.all_valid,
            pos_order=step.pos_order,
        )  # fmt: skip
        self.on_append(layer)
        layer.view = self.load_rows(layer, key_states.device)
        layer.attended = False
        step.layers_done.add(layer_idx)
        register_view(layer.view.keys, self, layer_idx)
        return layer.view.keys, layer.view.values

    def load_rows(self, layer: PolicyLayer, device: torch.device) -> Rows:
        """The rows attention reads at ``layer`` (offloading policies copy them from host here)."""
        return layer.store.rows(device=device)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """LOGICAL length (next RoPE position) — of the longest sequence of the batch."""
        return int(self.lengths.max()) if self.lengths is not None and self.lengths.numel() else 0

    def get_mask_sizes(self, query_length: int, layer_idx: int = 0) -> tuple[int, int]:
        return self.layers[layer_idx].get_mask_sizes(query_length)

    def get_query_offset(self, layer_idx: int = 0) -> int:
        """PHYSICAL rows held (what the mask's query offset must be)."""
        return self.layers[layer_idx].num_rows()

    def reset(self) -> None:
        for layer in self.layers:
            layer.reset()
        self.lengths = self.fed = self.step = self.prompt_lengths = None
        self.steps_done, self._select_s = 0, 0.0

    def select_batch(self, index: torch.Tensor) -> None:
        """Keep only the sequences ``index`` (finished ones leave the batch and their rows are freed)."""
        for layer in self.layers:
            if layer.store is not None:
                layer.store.select_batch(index)
        self.lengths = self.lengths[index.to(self.lengths.device)]
        self.fed = self.fed[index.to(self.fed.device)]
        if self.prompt_lengths is not None:
            self.prompt_lengths = self.prompt_lengths[index.to(self.prompt_lengths.device)]
        self.on_select_batch(index)

    def on_select_batch(self, index: torch.Tensor) -> None:
        """Hook: reindex any per-sequence policy state when the batch shrinks."""

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.select_batch(indices)

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot crop (rows were selected, not appended)")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.select_batch(beam_idx)

    # ------------------------------------------------------------------ stats
    def resident_rows(self) -> torch.Tensor:
        """``[L, B, H]`` rows held per layer, sequence and KV head."""
        ns = [layer.store.n.cpu() for layer in self.layers if layer.store is not None]
        return torch.stack(ns) if ns else torch.zeros(0, 0, 0, dtype=torch.long)

    def resident_bytes(self) -> dict[str, int]:
        """Bytes of every tensor this cache holds, split by where they live (``device`` / ``host``)."""
        return held_bytes(self)

    def sequence_kv_bytes(self) -> dict[str, torch.Tensor]:
        """Per sequence ``[B]``: key/value bytes of its own pages, by role."""
        groups: dict[tuple, list[PagedKV]] = {}
        for layer in self.layers:
            if layer.store is not None:
                s = layer.store
                groups.setdefault((s.role, s.slab, s.page_size, s.head_dim, s.k.element_size()), []).append(s)
        out: dict[str, torch.Tensor] = {}
        for (role, slab, p, d, size), stores in groups.items():
            if slab and len(stores) > 1:  # one op for all these layers: pages = ceil(n / p) per (b, h)
                n = torch.stack([s.n for s in stores])
                b = (
                    torch.div(n + p - 1, p, rounding_mode="floor").sum(dim=(0, 2)) * (2 * p * d * size)
                ).cpu()
            else:
                b = sum(s.seq_kv_bytes().cpu() for s in stores)
            out[role] = out.get(role, 0) + b
        return out

    def logical_lengths(self) -> torch.Tensor:
        return self.lengths.cpu() if self.lengths is not None else torch.zeros(0, dtype=torch.long)

    def pop_select_seconds(self) -> float:
        s, self._select_s = self._select_s, 0.0
        return s

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config})"
