"""What a policy cache holds, measured (:class:`CacheStats`): rows per (layer, sequence, KV head), bytes of the
tensors held by where they live, per-sequence KV bytes, logical lengths and selection time."""

from __future__ import annotations

import torch

from zoomr.cache.store import PagedKV
from zoomr.memory import held_bytes


class CacheStats:
    """Mixin of :class:`~zoomr.cache.base.PolicyCache` (reads its ``layers``, ``lengths`` and ``_select_s``)."""

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
