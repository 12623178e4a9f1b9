"""Evicting and timing, the actions a policy takes from its hooks (:class:`Eviction`), and where the stores live.

``evict(layer_idx, keep)`` frees every row not kept (the store compacts in place); ``selecting()`` times the
enclosed work as selection in the engine's stats (synchronising CUDA so the time is real).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from zoomr.cache.store import PagedKV


class Eviction:
    """Mixin of :class:`~zoomr.cache.base.PolicyCache` (uses its ``layers``, ``kv_heads``, ``head_dim``,
    ``page_size``, ``row_attrs``, ``store_role``, ``compute_device`` and ``_select_s``)."""

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
