"""KV storage for one model layer: rows per (batch element, KV head), in insertion order, really freed.

Two layouts, chosen by the store itself (the interface is the same):

- **slab** (the fast path): per layer, contiguous buffers ``k``/``v`` ``[B, H, cap, d]`` and ``pos``/``order``/
  attributes ``[B, H, cap]`` (keys and values are the two halves of one buffer, positions and order too, so
  every move of rows is one copy per pair); row j of (b, h) lives at ``start + j``. ``rows()`` returns *views*
  ``k[:, :, start:start + N]`` (no copy, no gather). ``cap`` grows geometrically (×1.25, in whole pages).
  Eviction compacts *in place*: the kept rows after the first evicted one slide down, or — when that moves
  fewer rows, as in StreamingLLM where the evicted row sits just after the sinks — the kept rows before the
  last evicted one slide up and ``start`` advances; the freed slots at the front are reclaimed in one burst
  when an append reaches the end of the buffer (R-KV's buffer idea, applied to memory moves). When more than
  half the capacity is free after an eviction the buffers are reallocated at the exact size, so evicted rows
  leave memory (the capacity held is always what ``bytes()`` reports).
- **paged** (ragged per-head rows, e.g. KVzap): page pools ``[n_pages, page_size, d]``, a page table
  ``[B, H, max_pages]`` and a row map; ``rows()`` gathers. Used while the (b, h) row counts are so uneven that
  a slab would hold more than 1.25× the pages the rows need. An eviction slides each (b, h)'s kept rows after
  its first evicted one down in place and returns emptied pages to the free list (KVzap's decode step moves
  ``window`` rows, not all of them); the pools are rebuilt at the exact size when that would move more rows
  than are kept or more than a quarter of the pages are free (and switch back to a slab once the counts are
  even again).

``pos`` is each row's RoPE position, ``order`` its feed index in its sequence (0, 1, 2, ... over the tokens
run through the model, forced tokens included; it defines causality inside a multi-token step), ``attrs``
optional per-row float attributes a policy asks for (e.g. H2O's accumulated attention), kept aligned with
the rows through appends and evictions. ``bytes`` counts every tensor the store holds; ``seq_kv_bytes`` the
pages a sequence's rows occupy (``ceil(n / page_size)`` per (b, h) in both layouts).
"""

from __future__ import annotations

import torch

from zoomr.cache.rows import Rows, _Source

SLAB_SLACK = 1.25  # slab layout while B*H*ceil(max n / p) <= SLAB_SLACK * sum ceil(n / p) pages
GROWTH = 1.25  # geometric growth of a slab's capacity
SHRINK_AT = 0.75  # reallocate at the exact size when the kept rows need at most this share of the capacity


def _ceil_div(a: torch.Tensor, b: int) -> torch.Tensor:
    return torch.div(a + b - 1, b, rounding_mode="floor")


def _round_up(x: int, p: int) -> int:
    return -(-x // p) * p


class PagedKV:
    """KV rows of one layer for ``batch`` sequences × ``heads`` KV heads (slab or paged layout, see module doc).

    ``role`` says where this store counts in the byte report (``"device"`` or ``"host"``); on a CPU-only
    machine an offloading policy's host store is still reported as host memory. ``pin`` pins host buffers
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
        self._n: torch.Tensor | None = None  # None: every (b, h) holds n_max rows (built on first read)
        self.n_max = self.n_min = 0  # python copies of n.max() / n.min() (no device sync on the hot path)
        self.version = 0  # bumped by every change of the rows (a copy made at version v is stale after)
        self._to_slab(0)

    @property
    def n(self) -> torch.Tensor:
        """``[B, H]`` rows held per (b, h). Even changes of even rows (a plain decode append, a span evicted
        everywhere) only move ``n_min``/``n_max``; the tensor is then built when someone reads it."""
        if self._n is None:
            self._n = torch.full((self.batch, self.heads), self.n_max, dtype=torch.long, device=self.device)
        return self._n

    @n.setter
    def n(self, value: torch.Tensor | None) -> None:
        self._n = value

    # ------------------------------------------------------------------ allocation
    def _empty(self, *shape: int, dtype: torch.dtype, fill: float | None = None) -> torch.Tensor:
        t = torch.empty(*shape, dtype=dtype, device=self.device, pin_memory=self.pin)
        if fill is not None:
            t.fill_(fill)
        return t

    def _to_slab(self, cap: int) -> None:
        """Switch to (or reallocate) an empty slab of ``cap`` rows per (b, h); paged structures are dropped."""
        B, H, d = self.batch, self.heads, self.head_dim
        self.slab, self.cap, self.start = True, cap, 0
        # zeros, not garbage: a masked-out slot is still multiplied by its 0 weight (NaN * 0 = NaN)
        self.kv = self._empty(2, B, H, cap, d, dtype=self.dtype, fill=0.0)  # keys and values, one buffer
        self.meta = self._empty(2, B, H, cap, dtype=torch.long, fill=-1)  # positions and feed order
        self.attrs = {a: self._empty(B, H, cap, dtype=torch.float32, fill=0.0) for a in self.attr_names}
        self._slab_views()
        self.table = self.free = self._flat = None

    def _slab_views(self) -> None:
        """``k``/``v`` and ``pos``/``order``: contiguous views of the fused slab buffers, so a memory move of
        the rows (compaction, a burst, a resize) is one operation per buffer pair."""
        self.k, self.v = self.kv[0], self.kv[1]
        self.pos, self.order = self.meta[0], self.meta[1]

    def _slab_bufs(self) -> list[tuple[torch.Tensor, int]]:
        """The slab's buffers, each with the dimension its rows run along."""
        return [(self.kv, 3), (self.meta, 3), *((a, 2) for a in self.attrs.values())]

    def _to_paged(self, n_pages: int) -> None:
        p, d = self.page_size, self.head_dim
        self.slab, self.cap, self.start = False, 0, 0
        self.kv = self.meta = None
        self.k = self._empty(n_pages, p, d, dtype=self.dtype)
        self.v = self._empty(n_pages, p, d, dtype=self.dtype)
        self.pos = self._empty(n_pages, p, dtype=torch.long, fill=-1)
        self.order = self._empty(n_pages, p, dtype=torch.long, fill=-1)
        self.attrs = {a: self._empty(n_pages, p, dtype=torch.float32, fill=0.0) for a in self.attr_names}
        self.free = torch.zeros(0, dtype=torch.long, device=self.device)

    @property
    def n_pages(self) -> int:
        """Pages of ``page_size`` rows the buffers hold (slab: ``B * H * cap / page_size``)."""
        if self.slab:
            return self.batch * self.heads * self.cap // self.page_size
        return self.k.shape[0]

    def _pools(self) -> list[torch.Tensor]:
        return [self.k, self.v, self.pos, self.order, *self.attrs.values()]

    def _set_pools(self, pools: list[torch.Tensor]) -> None:
        self.k, self.v, self.pos, self.order = pools[:4]
        self.attrs = dict(zip(self.attr_names, pools[4:]))

    def _update_extent(self) -> None:
        if self.n.numel():
            lo, hi = torch.aminmax(self.n)
            self.n_min, self.n_max = int(lo), int(hi)
        else:
            self.n_min = self.n_max = 0

    # ------------------------------------------------------------------ slab helpers
    def _slab_resize(self, cap: int) -> None:
        """Move the held rows into new buffers of ``cap`` rows per (b, h), starting at 0 (growth or shrink)."""
        N, s = self.n_max, self.start
        old = self._slab_bufs()
        self._to_slab(cap)
        if N:
            for (new_t, dim), (old_t, _) in zip(self._slab_bufs(), old):
                new_t.narrow(dim, 0, N).copy_(old_t.narrow(dim, s, N))

    def _reserve(self, need: int) -> None:
        """Make room for ``need`` rows from ``start``: slide the rows to the front (a burst: only when at least
        1/8 of the capacity is then free, so it is rare) or grow geometrically."""
        if self.start + need <= self.cap:
            return
        if self.start and need <= self.cap - max(1, self.cap // 8):
            N, s = self.n_max, self.start
            for t, dim in self._slab_bufs():
                src = t.narrow(dim, s, N)
                t.narrow(dim, 0, N).copy_(src.clone() if s < N else src)  # overlapping ranges go through a copy
            self.start = 0
            return
        grown = max(need, int(self.cap * GROWTH), self.cap + self.page_size)
        self._slab_resize(_round_up(grown, self.page_size))

    def _slab_flat(self, N: int) -> torch.Tensor:
        base = (
            torch.arange(self.batch * self.heads, device=self.device).view(self.batch, self.heads, 1)
            * self.cap
        )
        return base + self.start + torch.arange(N, device=self.device)

    # ------------------------------------------------------------------ writes
    def append(
        self,
        keys: torch.Tensor,
        values: torch.Tensor,
        pos: torch.Tensor,
        order: torch.Tensor,
        valid: torch.Tensor,
        all_valid: bool | None = None,
        pos_order: torch.Tensor | None = None,
    ) -> None:
        """Append the valid tokens of a step: ``keys``/``values`` ``[B, H, S, d]``; ``pos``/``order``/``valid`` ``[B, S]``.

        Every KV head of sequence b gets the same new rows (its valid tokens, in order); invalid tokens
        (left padding, idle sequences) are not stored at all. ``all_valid``: the caller already knows
        whether every token is valid (saves a reduction); ``pos_order``: ``pos`` and ``order`` stacked
        ``[2, B, S]``, when the caller has them so (one copy instead of two).
        """
        B, H, S, _ = keys.shape
        if (self.batch, self.heads) != (B, H):
            raise ValueError(f"append: got batch/heads {(B, H)}, store holds {(self.batch, self.heads)}")
        valid = valid.to(self.device)
        if all_valid is None:
            all_valid = bool(valid.all())
        if not all_valid and not bool(valid.any()):
            return  # nothing to store (the rows did not change)
        if self.slab:
            self._append_slab(keys, values, pos, order, valid, all_valid, pos_order)
        else:
            self._append_paged(keys, values, pos, order, valid, all_valid)
        self.version += 1

    def _append_slab(self, keys, values, pos, order, valid, all_valid: bool, pos_order=None) -> None:
        B, H, S, d = keys.shape
        dev = self.device
        if all_valid and self.n_min == self.n_max:  # every (b, h) holds the same rows: plain slice writes
            self._reserve(self.n_max + S)
            j0 = self.start + self.n_max
            j1 = j0 + S
            self.k[:, :, j0:j1].copy_(keys)  # copy_ converts device / dtype and broadcasts
            self.v[:, :, j0:j1].copy_(values)
            if pos_order is not None:
                self.meta[:, :, :, j0:j1].copy_(pos_order[:, :, None, :])
            else:
                self.pos[:, :, j0:j1].copy_(pos[:, None, :])
                self.order[:, :, j0:j1].copy_(order[:, None, :])
            for t in self.attrs.values():
                t[:, :, j0:j1].zero_()
            self.n = None  # still even: n_max everywhere
            self.n_max += S
            self.n_min += S
            return
        keys, values = keys.to(dev, self.dtype), values.to(dev, self.dtype)
        pos, order = pos.to(dev), order.to(dev)
        m = valid.sum(dim=1) if not all_valid else torch.full((B,), S, dtype=torch.long, device=dev)
        n_new = self.n + m[:, None]
        lo, hi = torch.aminmax(n_new)
        self._reserve(int(hi))
        rank = torch.cumsum(valid.long(), dim=1) - 1  # [B, S]
        j = self.start + self.n[:, :, None] + rank[:, None, :]  # [B, H, S] destination slot
        sel = valid[:, None, :].expand(B, H, S)
        b_idx = torch.arange(B, device=dev).view(B, 1, 1).expand(B, H, S)[sel]
        h_idx = torch.arange(H, device=dev).view(1, H, 1).expand(B, H, S)[sel]
        jj = j[sel]
        self.k[b_idx, h_idx, jj] = keys[sel]
        self.v[b_idx, h_idx, jj] = values[sel]
        self.pos[b_idx, h_idx, jj] = pos[:, None, :].expand(B, H, S)[sel]
        self.order[b_idx, h_idx, jj] = order[:, None, :].expand(B, H, S)[sel]
        for t in self.attrs.values():
            t[b_idx, h_idx, jj] = 0.0
        self.n = n_new
        self.n_min, self.n_max = int(lo), int(hi)

    # paged layout ------------------------------------------------------
    def _grow(self, extra: int) -> None:
        """Add at least ``extra`` free pages (geometric growth: unused pages are reported as held)."""
        old = self.n_pages
        new = old + max(extra, old // 4, self.batch * self.heads)
        pools = self._pools()
        grown = []
        for i, t in enumerate(pools):
            g = self._empty(new, *t.shape[1:], dtype=t.dtype, fill=-1 if i in (2, 3) else 0)
            g[:old].copy_(t)
            grown.append(g)
        self._set_pools(grown)
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

    def _append_paged(self, keys, values, pos, order, valid, all_valid: bool) -> None:
        B, H, S, _ = keys.shape
        dev, p, d = self.device, self.page_size, self.head_dim
        if S == 1 and all_valid:  # decoding: one row per (b, h), fewer ops
            j = self.n
            new_page = j % p == 0
            count = int(new_page.sum())
            self._ensure_table(self.n_max // p + 1)
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
        self.n = n_new
        self._update_extent()
        self._set_flat(bh, jj, flat, self.n_max)

    def _set_flat(self, bh: torch.Tensor, jj: torch.Tensor, flat: torch.Tensor, width: int) -> None:
        """Record the pool row of rows ``(bh, jj)`` in the row map (grown geometrically)."""
        if self._flat.shape[-1] < width:
            grown = torch.zeros(self.batch, self.heads, max(width, self._flat.shape[-1] * 5 // 4), dtype=torch.long,
                                device=self.device)  # fmt: skip
            grown[:, :, : self._flat.shape[-1]] = self._flat
            self._flat = grown
        self._flat.view(self.batch * self.heads, -1)[bh, jj] = flat

    # ------------------------------------------------------------------ reads
    def _valid(self, N: int) -> torch.Tensor:
        return torch.arange(N, device=self.device)[None, None, :] < self.n[:, :, None]

    def flat_index(self, n_rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(flat [B, H, N], valid [B, H, N])``: row id of every row of the padded view in the flattened
        buffers (``store.k.view(-1, d)[flat]``, ``store.pos.view(-1)[flat]``); only valid entries are meaningful."""
        N = self.n_max if n_rows is None else n_rows
        if self.slab:
            return self._slab_flat(N), self._valid(N)
        return self._flat[:, :, :N], self._valid(N)

    def rows(self, device: torch.device | str | None = None, non_blocking: bool = False) -> Rows:
        """The padded ``[B, H, N, d]`` rows: views of a slab (no copy), a gather of a paged store."""
        N = self.n_max
        if self.slab:
            s = self.start
            keys, values = self.k[:, :, s : s + N], self.v[:, :, s : s + N]
            rows = Rows(
                keys, values, n=self._n, source=_Source(self.pos, self.order, N, s), all_valid=self.n_min == N,
                n_even=N if self._n is None else None,
            )
        else:
            flat = self._flat[:, :, :N]
            B, H, d = self.batch, self.heads, self.head_dim
            keys = self.k.view(-1, d).index_select(0, flat.reshape(-1)).view(B, H, N, d)
            values = self.v.view(-1, d).index_select(0, flat.reshape(-1)).view(B, H, N, d)
            src = _Source(self.pos, self.order, N, flat=flat)
            rows = Rows(keys, values, n=self.n, source=src, all_valid=self.n_min == N)
        if device is not None and torch.device(device) != self.device:
            r = rows.materialize()
            fields = [r.keys, r.values, r.pos, r.order, r.valid, r.n]
            if self.pin:
                fields = [t.pin_memory() for t in fields]
            rows = Rows(*(t.to(device, non_blocking=non_blocking) for t in fields), all_valid=rows._all_valid)
        return rows

    def attr(self, name: str) -> torch.Tensor:
        """The padded ``[B, H, N]`` view of a per-row attribute (0 where invalid; a copy)."""
        N = self.n_max
        if self.slab:
            view = self.attrs[name][:, :, self.start : self.start + N]
            return view.clone() if self.n_min == N else view * self._valid(N)
        flat, valid = self.flat_index()
        return self.attrs[name].view(-1)[flat] * valid

    def add_to_attr(self, name: str, delta: torch.Tensor) -> None:
        """``attr[name] += delta`` for the rows of the padded view; ``delta`` is ``[B, H, N']`` with N' <= N."""
        M = delta.shape[-1]
        delta = delta.to(self.device, torch.float32)
        if self.slab:
            view = self.attrs[name][:, :, self.start : self.start + M]
            view.add_(delta if self.n_min >= M else delta * self._valid(M))
            return
        flat, valid = self.flat_index(M)
        self.attrs[name].view(-1).index_add_(0, flat[valid], delta[valid])

    def set_attr(self, name: str, value: torch.Tensor) -> None:
        M = value.shape[-1]
        value = value.to(self.device, torch.float32)
        if self.slab:
            view = self.attrs[name][:, :, self.start : self.start + M]
            view.copy_(value if self.n_min >= M else torch.where(self._valid(M), value, view))
            return
        flat, valid = self.flat_index(M)
        self.attrs[name].view(-1)[flat[valid]] = value[valid]

    # ------------------------------------------------------------------ eviction
    def retain(self, keep: torch.Tensor) -> None:
        """Keep the rows where ``keep [B, H, N]`` is True (aligned with :meth:`rows`); free everything else.

        Slab: kept rows are compacted in place (the cheaper of sliding the head or the tail), and the buffers
        are reallocated at the exact size when more than half of them would be free; paged: each (b, h)'s tail
        slides in place (:meth:`_slide_paged_tails`) unless a rebuild at the size the kept rows need is cheaper
        or the counts are even enough for a slab again; a slab that would become too uneven is rebuilt paged.
        """
        N = self.n_max
        shape = (self.batch, self.heads, N)
        if tuple(keep.shape) != shape:
            raise ValueError(f"retain: keep mask has shape {tuple(keep.shape)}, rows are {shape}")
        keep = keep.to(self.device)
        uniform = self.n_min == N
        gone = ~keep if uniform else self._valid(N) & ~keep
        evicted = gone.sum(-1)
        e_lo, e_hi = (int(x) for x in torch.aminmax(evicted)) if evicted.numel() else (0, 0)
        if e_hi == 0:
            return  # nothing evicted: the rows did not change
        n_keep = self.n - evicted
        if uniform and e_lo == e_hi:
            k_lo = k_hi = N - e_lo
        else:
            k_lo, k_hi = (int(x) for x in torch.aminmax(n_keep))
        if not self.slab or (k_lo != k_hi and not self._slab_fits(n_keep, k_hi)):
            if self.slab or self._slab_fits(n_keep, k_hi) or not self._slide_paged_tails(gone, n_keep, k_lo, k_hi):
                flat, valid = self.flat_index()
                self._rebuild(flat, keep & valid)
            return
        cols = gone.any(dim=1).any(dim=0).nonzero()  # columns holding an evicted row somewhere
        first, last = int(cols[0]), int(cols[-1]) + 1
        s = self.start
        head_cost = (last - e_lo) if e_lo == e_hi else None  # kept rows before the last evicted one
        tail_cost = N - first - e_lo  # kept rows from the first evicted one on (at most)
        if head_cost is not None and head_cost <= tail_cost:
            if head_cost:
                idx = torch.argsort(gone[:, :, :last].to(torch.int8), dim=-1, stable=True)[..., :head_cost]
                self._move(idx, s, s + e_lo, last)
            self.start = s + e_lo
        elif tail_cost:
            idx = torch.argsort(gone[:, :, first:].to(torch.int8), dim=-1, stable=True)[..., :tail_cost]
            self._move(idx, s + first, s + first, N - first)
        self._set_kept(n_keep, k_lo, k_hi)

    def evict_span(self, lo: int, hi: int) -> None:
        """Free rows ``lo <= j < hi`` of every (b, h) (e.g. StreamingLLM: the rows between the sinks and the
        window). A slab whose (b, h) all hold the same rows slides the cheaper side with slices; anything else
        goes through :meth:`retain`."""
        N = self.n_max
        lo, hi = max(0, lo), min(hi, N)
        if hi <= lo:
            return
        if not (self.slab and self.n_min == N):
            j = torch.arange(N, device=self.device)
            self.retain(((j < lo) | (j >= hi)).expand(self.batch, self.heads, N))
            return
        e, s = hi - lo, self.start
        if lo <= N - hi:  # slide the head up: start advances by e
            if lo:
                for t, dim in self._slab_bufs():
                    src = t.narrow(dim, s, lo)
                    t.narrow(dim, s + e, lo).copy_(src.clone() if e < lo else src)
            self.start = s + e
        else:  # slide the tail down
            for t, dim in self._slab_bufs():
                src = t.narrow(dim, s + hi, N - hi)
                t.narrow(dim, s + lo, N - hi).copy_(src.clone() if e < N - hi else src)
        self._set_kept(None, N - e, N - e)

    def drop_rows(self, j: torch.Tensor) -> None:
        """Free row ``j[b, h]`` of every (b, h) (one row each, e.g. H2O's lowest-scored row once a step's
        append passed the budget). A slab whose (b, h) all hold the same rows slides the cheaper side by one
        with a gather built without a sort — the rows before the last dropped one up (``start`` advances) or
        the rows after the first dropped one down; anything else goes through :meth:`retain`."""
        N = self.n_max
        j = j.to(self.device)
        if not (self.slab and self.n_min == N) or N == 0:
            keep = torch.arange(N, device=self.device) != j[:, :, None]
            self.retain(keep & self._valid(N))
            return
        lo, hi = (int(x) for x in torch.aminmax(j))
        s = self.start
        if hi < N - 1 - lo:  # rows 0 .. hi-1 of the new layout (slots s+1 .. s+hi) take the kept rows up to hi
            if hi:
                ar = torch.arange(hi, device=self.device)
                self._move(ar + (ar >= j[:, :, None]), s, s + 1, hi)
            self.start = s + 1
        elif span := N - 1 - lo:  # destination rows lo .. N-2 take the kept rows after them
            ar = torch.arange(span, device=self.device)
            self._move(ar + (ar >= (j - lo)[:, :, None]), s + lo, s + lo, span)
        self._set_kept(None, N - 1, N - 1)

    def _slide_paged_tails(self, gone: torch.Tensor, n_keep: torch.Tensor, k_lo: int, k_hi: int) -> bool:
        """Paged layout, in place: in each (b, h), the kept rows after its first evicted one slide down over the
        evicted ones (through the row map: row j lives in page ``table[j // p]`` at ``j % p``, so the rows before
        stay where they are), and pages left empty at the end go back to the free list. This is KVzap's decode
        step — the row that left the window, one per (b, h) at most, ``window`` rows from the end — at
        O(window) rows moved instead of a rebuild's O(held rows). False, with nothing changed, when the slide
        would move more rows than are kept (then the caller rebuilds). The pools are reallocated at the exact
        size once more than a quarter of their pages are free, so evicted rows still leave memory. ``k_lo``/``k_hi``:
        the smallest and largest of ``n_keep`` (the caller has them)."""
        B, H, N = gone.shape
        n, p, dev = self.n, self.page_size, self.device
        hit = gone.any(-1)
        first = torch.where(hit, gone.to(torch.int8).argmax(-1), n)  # first evicted row; n: none evicted
        M = int((n - first).max())
        if int(n_keep.sum()) < B * H * M:
            return False
        c = torch.arange(M, device=dev)
        rows = first[..., None] + c  # [B, H, M]: each (b, h)'s rows from its first evicted one
        rel = rows.clamp(max=N - 1)
        out = gone.gather(-1, rel) | (rows >= n[..., None])  # evicted, or past the (b, h)'s last row
        src = rel.gather(-1, torch.argsort(out.to(torch.int8), dim=-1, stable=True))  # kept rows first, in order
        move = c < (~out).sum(-1, keepdim=True)
        src_slot, dst_slot = self._flat.gather(-1, src)[move], self._flat.gather(-1, rel)[move]
        d = self.head_dim
        for i, t in enumerate(self._pools()):
            flat_t = t.view(-1, d) if i < 2 else t.view(-1)
            flat_t[dst_slot] = flat_t[src_slot]  # the gather makes a copy first: overlapping moves are safe
        have, need = _ceil_div(n, p), _ceil_div(n_keep, p)
        slots = torch.arange(self.table.shape[-1], device=dev)
        emptied = (slots >= need[..., None]) & (slots < have[..., None])
        if bool(emptied.any()):
            self.free = torch.cat([self.free, self.table[emptied]])
            self.table[emptied] = -1
        self.n = n_keep
        self.n_min, self.n_max = k_lo, k_hi
        self.version += 1
        if 4 * self.free.numel() > self.n_pages:  # too much free capacity: exact pools again
            flat, valid = self.flat_index()
            self._rebuild(flat, valid)
        return True

    def _set_kept(self, n_keep: torch.Tensor | None, k_lo: int, k_hi: int) -> None:
        self.n = n_keep
        self.n_min, self.n_max = k_lo, k_hi
        if _round_up(k_hi, self.page_size) <= self.cap * SHRINK_AT:
            self._slab_resize(_round_up(k_hi, self.page_size))
        self.version += 1

    def _move(self, idx: torch.Tensor, src0: int, dst0: int, span: int) -> None:
        """``buffer[:, :, dst0 + i] = buffer[:, :, src0 + idx[..., i]]`` for every buffer, ``idx < span``
        (row gathers with ``index_select`` into a temporary, so overlapping ranges are safe)."""
        B, H, count = idx.shape
        base = torch.arange(src0, src0 + B * H * self.cap, self.cap, device=self.device).view(B, H, 1)
        ids = (base + idx).view(-1)
        for t, dim in self._slab_bufs():
            lead, tail = t.shape[: dim - 2], t.shape[dim + 1 :]  # (2,) for the fused pairs; (d,) for keys
            moved = t.view(*lead, -1, *tail).index_select(dim - 2, ids).view(*lead, B, H, count, *tail)
            t.narrow(dim, dst0, count).copy_(moved)

    def _slab_fits(self, n: torch.Tensor, n_max: int) -> bool:
        """Whether rows counts ``n [B, H]`` are even enough for a slab (see ``SLAB_SLACK``)."""
        p = self.page_size
        exact = int(_ceil_div(n, p).sum())
        return self.batch * self.heads * -(-n_max // p) <= SLAB_SLACK * exact

    def select_batch(self, index: torch.Tensor) -> None:
        """Keep only the sequences ``index`` (in that order); the others' rows are freed."""
        index = index.to(self.device)
        n = self.n[index]  # before the batch size changes (an even ``n`` is built from it)
        if self.slab:
            self.batch = int(index.numel())
            self.kv, self.meta = self.kv[:, index], self.meta[:, index]
            self.attrs = {a: t[index] for a, t in self.attrs.items()}
            self._slab_views()
            self.n = n
            self._update_extent()
            self.version += 1
            return
        flat, valid = self.flat_index()
        self.batch = int(index.numel())
        self.n = n
        self._rebuild(flat[index], valid[index])

    def _rebuild(self, flat: torch.Tensor, keep: torch.Tensor) -> None:
        """New buffers holding exactly the kept rows (``flat``: their ids in the current flattened buffers),
        as a slab when the kept counts are even enough, else as exact pages."""
        B, H, N = flat.shape
        p, dev = self.page_size, self.device
        n_new = keep.sum(-1)
        n_max = int(n_new.max()) if n_new.numel() else 0
        src = flat[keep]  # kept rows, in (b, h, j) order
        rank = torch.cumsum(keep.long(), -1) - 1
        jj = rank[keep]
        bh = torch.arange(B * H, device=dev).view(B, H, 1).expand(B, H, N)[keep]
        old = self._pools()
        if self._slab_fits(n_new, n_max):
            self._to_slab(_round_up(n_max, p))
            dst = bh * self.cap + jj
        else:
            need = _ceil_div(n_new, p)
            n_pages = int(need.sum())
            self._to_paged(n_pages)
            width = int(need.max()) if B * H else 0
            self.table = torch.full((B, H, width), -1, dtype=torch.long, device=dev)
            if n_pages:
                owner = torch.repeat_interleave(torch.arange(B * H, device=dev), need.flatten())
                first = torch.cumsum(need.flatten(), 0) - need.flatten()
                slot = torch.arange(n_pages, device=dev) - first[owner]
                self.table.view(B * H, -1)[owner, slot] = torch.arange(n_pages, device=dev)
            dst = (
                self.table.view(B * H, -1)[bh, torch.div(jj, p, rounding_mode="floor")] * p + jj % p
                if src.numel()
                else src
            )
            self._flat = torch.zeros(B, H, n_max, dtype=torch.long, device=dev)
            if src.numel():
                self._flat.view(B * H, -1)[bh, jj] = dst
        d = self.head_dim
        for i, (new_t, old_t) in enumerate(zip(self._pools(), old)):
            if i < 2:  # keys, values
                new_t.view(-1, d)[dst] = old_t.reshape(-1, d)[src]
            else:
                new_t.view(-1)[dst] = old_t.reshape(-1)[src]
        self.n = n_new
        self._update_extent()
        self.version += 1

    # ------------------------------------------------------------------ accounting
    def tensors(self) -> list[torch.Tensor]:
        n = [] if self._n is None else [self._n]
        if self.slab:
            return [self.kv, self.meta, *self.attrs.values(), *n]
        return [*self._pools(), *n, self.table, self.free, self._flat]

    def bytes(self) -> int:
        """Bytes of every tensor this store holds (buffers with their free capacity, tables, counters)."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def kv_bytes(self) -> int:
        """Bytes of the key and value buffers alone."""
        return sum(t.numel() * t.element_size() for t in (self.k, self.v))

    def seq_kv_bytes(self) -> torch.Tensor:
        """``[B]``: key/value bytes of the pages each sequence's rows occupy (``ceil(n / page_size)`` per head)."""
        if self.slab:
            pages = _ceil_div(self.n, self.page_size).sum(dim=1)
        else:
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
