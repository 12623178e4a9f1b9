"""What attention reads of a layer's store: padded per-(b, h) rows, their masks built only when read.

:class:`~zoomr.cache.store.PagedKV` hands out :class:`Rows` (views of a slab, a gather of pages); the
``pos``/``order``/``valid`` fields and an even ``n`` are built from the store's buffers on first read, since
plain decoding reads none of them.
"""

from __future__ import annotations

import torch


class _Source:
    """Where a :class:`Rows` builds ``pos``/``order``/``valid`` on first read: the store's buffers (the same
    storages, so byte counts see them once) and the slab offset or the paged row map."""

    def __init__(self, pos: torch.Tensor, order: torch.Tensor, n_rows: int, start: int = 0,
                 flat: torch.Tensor | None = None) -> None:  # fmt: skip
        self.pos, self.order, self.n_rows, self.start, self.flat = pos, order, n_rows, start, flat

    def build(self, name: str, n: torch.Tensor) -> torch.Tensor:
        N = self.n_rows
        valid = torch.arange(N, device=n.device)[None, None, :] < n[:, :, None]
        if name == "valid":
            return valid
        src = self.pos if name == "pos" else self.order
        rows = src[:, :, self.start : self.start + N] if self.flat is None else src.view(-1)[self.flat]
        return rows.masked_fill(~valid, -1)


class Rows:
    """A padded, per-(b, h) view of the rows of a store (row ``j`` of (b, h) is valid iff ``j < n[b, h]``).

    ``keys``/``values`` ``[B, H, N, d]`` (views into a slab store: do not write), ``pos``/``order`` ``[B, H, N]``
    (-1 where invalid), ``valid [B, H, N]`` bool, ``n [B, H]``. A store builds ``pos``/``order``/``valid`` only
    when a consumer reads them (plain decoding reads none of them), and ``n`` too when every (b, h) holds
    ``n_even`` rows.
    """

    def __init__(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        pos: torch.Tensor | None = None,
        order: torch.Tensor | None = None,
        valid: torch.Tensor | None = None,
        n: torch.Tensor | None = None,
        *,
        source: _Source | None = None,
        all_valid: bool | None = None,
        n_even: int | None = None,
    ) -> None:
        self.keys, self.values, self._n, self._n_even = keys, values, n, n_even
        self._pos, self._order, self._valid = pos, order, valid
        self._source, self._all_valid = source, all_valid

    @property
    def n(self) -> torch.Tensor | None:
        if self._n is None and self._n_even is not None:
            B, H = self.keys.shape[:2]
            self._n = torch.full((B, H), self._n_even, dtype=torch.long, device=self.keys.device)
        return self._n

    def _get(self, name: str) -> torch.Tensor:
        t = getattr(self, "_" + name)
        if t is None:
            t = self._source.build(name, self.n)
            setattr(self, "_" + name, t)
        return t

    @property
    def pos(self) -> torch.Tensor:
        return self._get("pos")

    @property
    def order(self) -> torch.Tensor:
        return self._get("order")

    @property
    def valid(self) -> torch.Tensor:
        return self._get("valid")

    @property
    def all_valid(self) -> bool:
        """Every (b, h) holds all ``N`` rows (no mask needed)."""
        if self._all_valid is None:
            self._all_valid = bool(self.valid.all())
        return self._all_valid

    @property
    def num_rows(self) -> int:
        return self.keys.shape[-2]

    def materialize(self) -> Rows:
        """The same rows with every field built (for copies to another device)."""
        return Rows(
            self.keys, self.values, self.pos, self.order, self.valid, self.n, all_valid=self._all_valid
        )
