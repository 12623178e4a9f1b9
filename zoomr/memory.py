"""Byte accounting: what a cache really holds, and the analytic size of a full KV cache."""

from __future__ import annotations

import dataclasses
from numbers import Integral
from typing import Any

import torch

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


_LEAVES = (str, int, float, bool, type, torch.device, torch.dtype)  # hold no tensors


def _walk(obj: Any, seen: set[int], out: list[tuple[torch.Tensor, str | None]], role: str | None) -> None:
    """Collect every tensor reachable from ``obj`` through attributes, lists, tuples and dicts."""
    if id(obj) in seen or obj is None or isinstance(obj, (str, int, float, bool, type)):
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        out.append((obj, role))
        return
    if isinstance(obj, torch.nn.Module):  # never count model weights a policy may reference
        return
    own_role = getattr(obj, "role", None)
    if own_role in ("device", "host"):
        role = own_role
    skip = set(getattr(obj, "_bytes_skip", ()))
    if own_role in ("device", "host") and callable(getattr(obj, "tensors", None)):
        children = list(obj.tensors())  # a KV store lists every tensor it holds (checked against gc in tests)
    elif isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, (list, tuple, set)):
        children = list(obj)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        children = [getattr(obj, f.name) for f in dataclasses.fields(obj)]
    elif hasattr(obj, "__dict__"):
        children = [v for k, v in vars(obj).items() if k not in skip]
    else:
        return
    for child in children:
        if child is not None and not isinstance(child, _LEAVES):  # skip the calls for plain values
            _walk(child, seen, out, role)


def held_tensors(obj: Any) -> list[tuple[torch.Tensor, str | None]]:
    """Every tensor reachable from ``obj`` (model modules excluded) with the storage role that holds it."""
    out: list[tuple[torch.Tensor, str | None]] = []
    _walk(obj, set(), out, None)
    return out


def held_bytes(obj: Any) -> dict[str, int]:
    """Bytes of the distinct storages reachable from ``obj``, split into ``device`` and ``host``.

    A tensor inside a store with ``role="host"`` counts as host memory even on a CPU-only machine (that is
    where an offloading policy keeps it); other CPU tensors count as host only when the computation runs on
    an accelerator. Views sharing a storage are counted once.
    """
    compute = getattr(obj, "compute_device", None)
    compute_is_cpu = compute is None or torch.device(compute).type == "cpu"
    totals = {"device": 0, "host": 0}
    seen: set[tuple[str, int]] = set()
    for t, role in held_tensors(obj):
        storage = t.untyped_storage()
        key = (str(t.device), storage.data_ptr())
        if storage.nbytes() == 0 or key in seen:
            continue
        seen.add(key)
        if role is None:
            role = "device" if t.device.type != "cpu" or compute_is_cpu else "host"
        totals[role] += storage.nbytes()
    return totals


def kv_bytes_per_token(model_config: Any, dtype: str | torch.dtype = "float32") -> int:
    """Bytes of one token's keys and values over all layers and KV heads."""
    c = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    if not isinstance(dtype, torch.dtype) and str(dtype) not in _DTYPE_BYTES:  # a KeyError before
        raise ValueError(f"dtype {dtype!r}: not a torch.dtype nor one of {sorted(_DTYPE_BYTES)}")
    size = dtype.itemsize if isinstance(dtype, torch.dtype) else _DTYPE_BYTES[str(dtype)]
    return 2 * c.num_hidden_layers * heads * head_dim * size


def full_kv_bytes(
    model_config: Any, tokens: int, batch: int = 1, dtype: str | torch.dtype = "float32"
) -> int:
    """Bytes of a full (uncompressed) KV cache of ``tokens`` tokens for ``batch`` sequences."""
    bad = [f"{name}={v!r}" for name, v in (("tokens", tokens), ("batch", batch))
           if isinstance(v, bool) or not isinstance(v, Integral) or v < 0]  # fmt: skip
    if bad:  # a negative or fractional byte count was returned without a word
        raise ValueError(f"full_kv_bytes: {', '.join(bad)} (must be ints >= 0)")
    return batch * tokens * kv_bytes_per_token(model_config, dtype)
