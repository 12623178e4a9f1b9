"""The KV-cache policy base: a ``transformers.Cache`` whose layers hold ragged, really-freed rows.

:class:`PolicyCache` is the ``Cache`` adapter (``update``, lengths, masks, batch selection) over per-layer
:class:`PolicyLayer` stores (:class:`~zoomr.cache.store.PagedKV`); its other jobs live in their own modules:
the hooks a policy overrides and how to write one (:mod:`zoomr.cache.hooks`), the step records and protocol
(:mod:`zoomr.cache.step`), evicting (:mod:`zoomr.cache.eviction`), the measurements (:mod:`zoomr.cache.stats`).

``update()`` (called by the attention module of layer l): append this step's valid rows to layer l's store,
run ``on_append(layer)``, and return the rows attention reads (``load_rows``: every resident row, or for a
host-resident policy the rows it says attention needs, see :mod:`zoomr.cache.offload`).
``get_seq_length()`` is the LOGICAL length; ``get_mask_sizes`` / ``get_query_offset`` are PHYSICAL.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from zoomr.attention import register_view
from zoomr.cache.eviction import Eviction
from zoomr.cache.hooks import PolicyHooks
from zoomr.cache.stats import CacheStats
from zoomr.cache.step import ForcedInput, Step, StepProtocol
from zoomr.cache.store import PagedKV, Rows

__all__ = ["CLOSED", "ForcedInput", "PolicyCache", "PolicyLayer", "Step"]

CLOSED = ("begin_step", "end_step", "update")  # the step protocol: no policy overrides these


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
        self.incoming: tuple[torch.Tensor, torch.Tensor] | None = None  # this step's new keys/values, in update
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


def attention_shape(model_config: Any) -> tuple[int, int, int, int]:
    """(layers, query heads, KV heads, head dim) of a model config: the shape a cache is built for."""
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    q_heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or q_heads
    return text.num_hidden_layers, q_heads, kv_heads, getattr(text, "head_dim", None) or text.hidden_size // q_heads


POLICY_ATTENTION = "the cache policies' attention (attn_implementation 'zoomr')"


def sliding_window_problem(model_config: Any, attention: str = POLICY_ATTENTION) -> str | None:
    """Why the ``"zoomr"`` attention cannot run ``model_config`` as transformers does (None: it can). It masks by the
    rows a policy holds and has no sliding window, so a layer that attends to the last ``sliding_window`` tokens only
    (a qwen2/qwen3 config with ``use_sliding_window=true``, phi3's ``sliding_window``) read every row past its window
    without a word: every policy, full KV included, decoded another model than ``model.generate``. A window no
    sequence can outgrow (``>= max_position_embeddings``) is not one. ``attention`` names the attention that lacks
    the window (the masked trainers' block-mask attention has none either)."""
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    window, types = getattr(text, "sliding_window", None), list(getattr(text, "layer_types", None) or [])
    sliding = [i for i, kind in enumerate(types) if kind != "full_attention"]
    if (types and not sliding) or (not types and window is None):
        return None
    limit = getattr(text, "max_position_embeddings", None)
    if isinstance(window, int) and isinstance(limit, int) and window >= limit:
        return None
    which = f"layers {sliding} ({', '.join(sorted({types[i] for i in sliding}))})" if sliding else "every layer"
    return (
        f"{which} of this {text.model_type} model attend only to the last sliding_window={window} tokens, and "
        f"{attention} has no sliding window: it would attend past it and compute another model; use a model without "
        "sliding-window attention (config use_sliding_window=false / sliding_window=null)"
    )


class PolicyCache(StepProtocol, Eviction, CacheStats, PolicyHooks, Cache):
    """Base class of every KV-cache policy. Subclasses override hooks; the base keeps storage and bookkeeping.

    Args:
        config: the policy's hyperparameter dataclass (in the policy's own file; see :mod:`zoomr.cache.config`).
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
        if problem := sliding_window_problem(text):
            raise ValueError(f"policy {getattr(config, 'name', None) or self.policy_name!r}: {problem}")
        self.config = config
        self.model_config = text
        self.tokenizer = tokenizer
        self.num_layers, self.q_heads, self.kv_heads, self.head_dim = attention_shape(text)
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

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """The step protocol is closed: a policy reacts in hooks (``on_step_begin``, ``on_append``, …)."""
        super().__init_subclass__(**kwargs)
        for name in CLOSED:
            if name in cls.__dict__:
                raise TypeError(
                    f"{cls.__name__} overrides {name}: the step protocol belongs to PolicyCache; react in the "
                    "hooks instead (on_step_begin, on_append, on_queries, after_attention, on_step_end; "
                    "zoomr/cache/hooks.py), and say which held rows attention reads with HostRowsMixin.attended_rows"
                )

    def ignored_settings(self, fields: set[str]) -> list[str]:
        """Of the config ``fields`` a user set, those this cache serves with another value (e.g. a layout its
        checkpoint replaced), each as ``method.<field>=<asked> (…)``; none by default."""
        return []

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
        layer.incoming = (key_states, value_states)
        try:
            layer.view = self.load_rows(layer, key_states.device)
        finally:
            layer.incoming = None
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

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.select_batch(indices)

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot crop (rows were selected, not appended)")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.select_batch(beam_idx)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config})"
