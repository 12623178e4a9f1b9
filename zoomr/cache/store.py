"""Paged, ragged KV storage for one model layer: rows per (batch element, KV head), really freed on eviction.

Layout (like vLLM's paged KV, but held by one layer):

- ``k``, ``v``: page pools ``[n_pages, page_size, head_dim]``;
- ``pos``: the RoPE position of every row (``[n_pages, page_size]``, -1 where unused);
- ``order``: the feed index of every row in its sequence (0, 1, 2, ... over the tokens run through the model,
  forced tokens included), which defines causality inside a multi-token step;
- ``attrs``: optional per-row float attributes a policy asks for (e.g. H2O's accumulated attention),
  kept aligned with the rows through appends and evictions;
- ``table``: ``[B, H, max_pages]`` page ids per (b, h) in row order (-1 = none), ``n``: ``[B, H]`` rows held.

Rows of one (b, h) are kept in insertion order. ``append`` grows the pools geometrically (unused pages are
held memory and are reported as such). ``retain`` rebuilds the pools from the kept rows, so evicted rows
are physically released — a masked row never stays resident. ``bytes`` counts every tensor the store holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Rows:
    """A padded, per-(b, h) view of the rows of a store (row ``j`` of (b, h) is valid iff ``j < n[b, h]``)."""

    keys: torch.Tensor  # [B, H, N, d]
    values: torch.Tensor  # [B, H, N, d]
    pos: torch.Tensor  # [B, H, N] RoPE position (-1 where invalid)
    order: torch.Tensor  # [B, H, N] feed index (-1 where invalid)
    valid: torch.Tensor  # [B, H, N] bool
    n: torch.Tensor  # [B, H] rows per (b, h)

    @property
    def num_rows(self) -> int:
        return self.keys.shape[-2]


def _ceil_div(a: torch.Tensor, b: int) -> torch.Tensor:
    return torch.div(a + b - 1, b, rounding_mode="floor")


class PagedKV:
    """Ragged KV rows of one layer for ``batch`` sequences × ``heads`` KV heads.

    ``role`` says where this store counts in the byte report (``"device"`` or ``"host"``); on a CPU-only
    machine an offloading policy's host store is still reported as host memory. ``pin`` pins host pools
    (only when CUDA is available) so copies to the accelerator can be asynchronous.
    """

    def __init__(
        self,
        batch: int,
        heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        page_size: int = 16,
        role: str = "device",
        pin: bool = False,
        attrs: tuple[str, ...] = (),
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        if role not in ("device", "host"):
            raise ValueError(f"role must be 'device' or 'host', got {role!r}")
        self.batch, self.heads, self.head_dim = batch, heads, head_dim
        self.dtype, self.device, self.page_size, self.role = dtype, torch.device(device), page_size, role
        self.pin = bool(pin and torch.cuda.is_available() and self.device.type == "cpu")
        self.attr_names = tuple(attrs)
        self.n = torch.zeros(batch, heads, dtype=torch.long, device=self.device)
        self.table = torch.full((batch, heads, 0), -1, dtype=torch.long, device=self.device)
        self._alloc_pools(0)
        self.free = torch.zeros(0, dtype=torch.long, device=self.device)  # ids of unused pages
        self.version = 0  # bumped by every change of the rows (a copy made at version v is stale after)
        self._flat = torch.zeros(
            batch, heads, 0, dtype=torch.long, device=self.device
        )  # row map: pool row of (b, h, j)

    # ------------------------------------------------------------------ allocation
    def _empty(self, *shape: int, dtype: torch.dtype, fill: float | None = None) -> torch.Tensor:
        t = torch.empty(*shape, dtype=dtype, device=self.device, pin_memory=self.pin)
        if fill is not None:
            t.fill_(fill)
        return t

    def _alloc_pools(self, n_pages: int) -> None:
        p, d = self.page_size, self.head_dim
        self.k = self._empty(n_pages, p, d, dtype=self.dtype)
        self.v = self._empty(n_pages, p, d, dtype=self.dtype)
        self.pos = self._empty(n_pages, p, dtype=torch.long, fill=-1)
        self.order = self._empty(n_pages, p, dtype=torch.long, fill=-1)
        self.attrs = {a: self._empty(n_pages, p, dtype=torch.float32, fill=0.0) for a in self.attr_names}

    @property
    def n_pages(self) -> int:
        return self.k.shape[0]

    def _pools(self) -> list[torch.Tensor]:
        return [self.k, self.v, self.pos, self.order, *self.attrs.values()]

    def _grow(self, extra: int) -> None:
        """Add at least ``extra`` free pages (geometric growth: unused pages are reported as held)."""
        old = self.n_pages
        new = old + max(extra, old // 4, self.batch * self.heads)
        pools = self._pools()
        names = ["k", "v", "pos", "order", *[("attr", a) for a in self.attr_names]]
        for name, t in zip(names, pools):
            fill = -1 if name in ("pos", "order") else 0
            g = self._empty(new, *t.shape[1:], dtype=t.dtype, fill=fill)
            g[:old].copy_(t)
            if isinstance(name, tuple):
                self.attrs[name[1]] = g
            else:
                setattr(self, name, g)
        self.free = torch.cat([self.free, torch.arange(old, new, device=self.device)])

    def _take_pages(self, count: int) -> torch.Tensor:
        if count > self.free.numel():
            self._grow(count - self.free.numel())
        ids, self.free = self.free[:count], self.free[count:]
        return ids

    def _ensure_table(self, pages_per_seq: int) -> None:
        if self.table.shape[-1] < pages_per_seq:
            pad = torch.full(
                (self.batch, self.heads, pages_per_seq - self.table.shape[-1]),
                -1,
                dtype=torch.long,
                device=self.device,
            )
            self.table = torch.cat([self.table, pad], dim=-1)

    # ------------------------------------------------------------------ writes
    def append(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        pos: torch.Tensor,
        order: torch.Tensor,
        valid: torch.Tensor,
    ) -> None:
        """Append the valid tokens of a step: ``keys``/``values`` ``[B, H, S, d]``; ``pos``/``order``/``valid`` ``[B, S]``.

        Every KV head of sequence b gets the same new rows (its valid tokens, in order); invalid tokens
        (left padding, idle sequences) are not stored at all.
        """
        B, H, S, _ = keys.shape
        if (self.batch, self.heads) != (B, H):
            raise ValueError(f"append: got batch/heads {(B, H)}, store holds {(self.batch, self.heads)}")
        dev, p, d = self.device, self.page_size, self.head_dim
        valid = valid.to(dev)
        if S == 1 and bool(valid.all()):  # decoding: one row per (b, h), fewer ops
            j = self.n
            new_page = j % p == 0
            count = int(new_page.sum())
            self._ensure_table(int(j.max()) // p + 1)
            if count:
                self.table[new_page, torch.div(j[new_page], p, rounding_mode="floor")] = self._take_pages(
                    count
                )
            flat = (
                self.table.gather(-1, torch.div(j, p, rounding_mode="floor")[..., None])[..., 0] * p + j % p
            ).view(-1)
            jj, bh = j.view(-1), torch.arange(B * H, device=dev)
            self.k.view(-1, d)[flat] = keys.to(dev, self.dtype).reshape(B * H, d)
            self.v.view(-1, d)[flat] = values.to(dev, self.dtype).reshape(B * H, d)
            self.pos.view(-1)[flat] = pos.to(dev).expand(B, H).reshape(-1)
            self.order.view(-1)[flat] = order.to(dev).expand(B, H).reshape(-1)
            n_new = j + 1
        else:
            m = valid.sum(dim=1)  # [B]
            if int(m.sum()) == 0:
                return
            n_old = self.n
            n_new = n_old + m[:, None]
            have = _ceil_div(n_old, p)
            need = _ceil_div(n_new, p)
            extra = (need - have).flatten()  # pages to add per (b, h)
            total = int(extra.sum())
            self._ensure_table(int(need.max()))
            if total:
                ids = self._take_pages(total)
                # table slot of each new page: have[b,h] + 0..extra[b,h]-1
                owner = torch.repeat_interleave(torch.arange(B * H, device=dev), extra)
                first = torch.cumsum(extra, 0) - extra
                slot = torch.arange(total, device=dev) - first[owner] + have.flatten()[owner]
                self.table.view(B * H, -1)[owner, slot] = ids
            # destination row of every valid token: j = n_old + rank
            rank = torch.cumsum(valid.long(), dim=1) - 1  # [B, S]
            j = n_old[:, :, None] + rank[:, None, :]  # [B, H, S]
            sel = valid[:, None, :].expand(B, H, S)
            jj = j[sel]
            bh = torch.arange(B * H, device=dev).view(B, H, 1).expand(B, H, S)[sel]
            flat = self.table.view(B * H, -1)[bh, torch.div(jj, p, rounding_mode="floor")] * p + jj % p
            self.k.view(-1, d)[flat] = keys.to(dev, self.dtype)[sel]
            self.v.view(-1, d)[flat] = values.to(dev, self.dtype)[sel]
            self.pos.view(-1)[flat] = pos.to(dev)[:, None, :].expand(B, H, S)[sel]
            self.order.view(-1)[flat] = order.to(dev)[:, None, :].expand(B, H, S)[sel]
        for t in self.attrs.values():
            t.view(-1)[flat] = 0.0
        self._set_flat(bh, jj, flat, int(n_new.max()))
        self.n = n_new
        self.version += 1

    def _set_flat(self, bh: torch.Tensor, jj: torch.Tensor, flat: torch.Tensor, width: int) -> None:
        """Record the pool row of rows ``(bh, jj)`` in the row map (grown geometrically)."""
        if self._flat.shape[-1] < width:
            grown = torch.zeros(self.batch, self.heads, max(width, self._flat.shape[-1] * 5 // 4), dtype=torch.long,
                                device=self.device)  # fmt: skip
            grown[:, :, : self._flat.shape[-1]] = self._flat
            self._flat = grown
        self._flat.view(self.batch * self.heads, -1)[bh, jj] = flat

    # ------------------------------------------------------------------ reads
    def flat_index(self, n_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(flat [B, H, N], valid [B, H, N])``: pool row id of every row of the padded view (0 where invalid)."""
        N = int(self.n.max()) if n_rows is None else n_rows
        valid = torch.arange(N, device=self.device)[None, None, :] < self.n[:, :, None]
        return self._flat[:, :, :N], valid

    def rows(self, device: torch.device | str | None = None, non_blocking: bool = False) -> Rows:
        """Gather every (b, h)'s rows into a padded view ``[B, H, N, d]`` (a copy: pages are not contiguous)."""
        flat, valid = self.flat_index()
        B, H, N = flat.shape
        d = self.head_dim
        keys = self.k.view(-1, d)[flat.flatten()].view(B, H, N, d)
        values = self.v.view(-1, d)[flat.flatten()].view(B, H, N, d)
        neg = torch.full((), -1, dtype=torch.long, device=self.device)
        pos = self.pos.view(-1)[flat].where(valid, neg)
        order = self.order.view(-1)[flat].where(valid, neg)
        rows = Rows(keys, values, pos, order, valid, self.n.clone())
        if device is not None and torch.device(device) != self.device:
            if self.pin:
                rows = Rows(*(t.pin_memory() for t in (keys, values, pos, order, valid, rows.n)))
            rows = Rows(
                *(
                    t.to(device, non_blocking=non_blocking)
                    for t in (rows.keys, rows.values, rows.pos, rows.order, rows.valid, rows.n)
                )
            )
        return rows

    def attr(self, name: str) -> torch.Tensor:
        """The padded ``[B, H, N]`` view of a per-row attribute (0 where invalid)."""
        flat, valid = self.flat_index()
        return self.attrs[name].view(-1)[flat] * valid

    def add_to_attr(self, name: str, delta: torch.Tensor) -> None:
        """``attr[name] += delta`` for the rows of the padded view; ``delta`` is ``[B, H, N']`` with N' <= N."""
        flat, valid = self.flat_index(delta.shape[-1])
        self.attrs[name].view(-1).index_add_(0, flat[valid], delta.to(self.device, torch.float32)[valid])

    def set_attr(self, name: str, value: torch.Tensor) -> None:
        flat, valid = self.flat_index(value.shape[-1])
        self.attrs[name].view(-1)[flat[valid]] = value.to(self.device, torch.float32)[valid]

    # ------------------------------------------------------------------ eviction
    def retain(self, keep: torch.Tensor) -> None:
        """Keep the rows where ``keep [B, H, N]`` is True (aligned with :meth:`rows`); free everything else.

        The pools are rebuilt at the size the kept rows need, so evicted rows leave memory at once.
        """
        flat, valid = self.flat_index()
        if keep.shape != flat.shape:
            raise ValueError(f"retain: keep mask has shape {tuple(keep.shape)}, rows are {tuple(flat.shape)}")
        keep = keep.to(self.device) & valid
        self._rebuild(flat, keep)

    def select_batch(self, index: torch.Tensor) -> None:
        """Keep only the sequences ``index`` (in that order); the others' rows are freed."""
        flat, valid = self.flat_index()
        index = index.to(self.device)
        self.batch = int(index.numel())
        self.n = self.n[index]
        self._rebuild(flat[index], valid[index], n_known=True)

    def _rebuild(self, flat: torch.Tensor, keep: torch.Tensor, n_known: bool = False) -> None:
        B, H, N = flat.shape
        p, dev = self.page_size, self.device
        n_new = keep.sum(-1)
        need = _ceil_div(n_new, p)
        n_pages = int(need.sum())
        src = flat[keep]  # kept pool rows, in (b, h, j) order
        old = self._pools()
        self._alloc_pools(n_pages)
        self.free = torch.zeros(0, dtype=torch.long, device=dev)
        width = int(need.max()) if B * H else 0
        self.table = torch.full((B, H, width), -1, dtype=torch.long, device=dev)
        if n_pages:
            owner = torch.repeat_interleave(torch.arange(B * H, device=dev), need.flatten())
            first = torch.cumsum(need.flatten(), 0) - need.flatten()
            slot = torch.arange(n_pages, device=dev) - first[owner]
            self.table.view(B * H, -1)[owner, slot] = torch.arange(n_pages, device=dev)
        rank = torch.cumsum(keep.long(), -1) - 1
        jj = rank[keep]
        bh = torch.arange(B * H, device=dev).view(B, H, 1).expand(B, H, N)[keep]
        dst = (
            self.table.view(B * H, -1)[bh, torch.div(jj, p, rounding_mode="floor")] * p + jj % p
            if src.numel()
            else src
        )
        for new_t, old_t in zip(self._pools(), old):
            if new_t.dim() == 3:
                new_t.view(-1, new_t.shape[-1])[dst] = old_t.view(-1, old_t.shape[-1])[src]
            else:
                new_t.view(-1)[dst] = old_t.view(-1)[src]
        self._flat = torch.zeros(B, H, int(n_new.max()) if B * H else 0, dtype=torch.long, device=dev)
        if src.numel():
            self._flat.view(B * H, -1)[bh, jj] = dst
        self.n = n_new
        self.version += 1

    # ------------------------------------------------------------------ accounting
    def tensors(self) -> list[torch.Tensor]:
        return [*self._pools(), self.table, self.n, self.free, self._flat]

    def bytes(self) -> int:
        """Bytes of every tensor this store holds (pools with their free pages, tables, counters)."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def kv_bytes(self) -> int:
        """Bytes of the key and value pools alone."""
        return sum(t.numel() * t.element_size() for t in (self.k, self.v))

    def seq_kv_bytes(self) -> torch.Tensor:
        """``[B]``: key/value bytes of the pages each sequence holds (its exact share of the pools)."""
        pages = (self.table >= 0).sum(dim=(1, 2))
        per_page = 2 * self.page_size * self.head_dim * self.k.element_size()
        return pages * per_page

    # ------------------------------------------------------------------ re-rotation
    def reposition(self, new_pos: torch.Tensor, inv_freq: torch.Tensor) -> None:
        """Re-rotate every held key from its position to ``new_pos [B, H, N]`` (aligned with :meth:`rows`)."""
        from zoomr.cache.rope import rotate

        flat, valid = self.flat_index()
        idx = flat[valid]
        delta = new_pos.to(self.device)[valid] - self.pos.view(-1)[idx]
        k = self.k.view(-1, self.head_dim)
        k[idx] = rotate(k[idx], delta, inv_freq)
        self.pos.view(-1)[idx] = new_pos.to(self.device)[valid]
        self.version += 1
