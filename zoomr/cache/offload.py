"""Full KV cache offloaded to host memory: only the current layer's rows are on the device.

Rows live in host stores (pinned when CUDA is available). In ``update`` the new rows are written to the host
store and the layer's rows are brought to the device for its attention; the device copy is dropped right
after. With ``prefetch`` the next layer's rows are copied while this layer computes (a side CUDA stream;
on a CPU-only machine the same code runs with plain copies), and the new rows are merged into the prefetched
copy. :class:`HostRowsMixin` is the reusable part: a policy whose full cache lives on host (ZoomR)
subclasses it and says which rows attention needs (:meth:`HostRowsMixin.attended_rows`); the mixin gathers,
copies and prefetches only those.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zoomr.cache.base import PolicyCache, PolicyLayer
from zoomr.cache.config import PolicyConfig
from zoomr.cache.registry import register_policy
from zoomr.cache.store import PagedKV, Rows


def extend_rows(
    rows: Rows,
    keys: torch.Tensor,
    values: torch.Tensor,
    pos: torch.Tensor,
    order: torch.Tensor,
    valid: torch.Tensor,
) -> Rows:
    """``rows`` with this step's valid tokens appended to every (b, h) (same layout as ``PagedKV.rows``)."""
    B, H, S, d = keys.shape
    m = valid.sum(1)
    n_new = rows.n + m[:, None].to(rows.n.device)
    N = int(n_new.max())
    dev = rows.keys.device
    out_k = rows.keys.new_zeros(B, H, N, d)
    out_v = rows.values.new_zeros(B, H, N, d)
    out_k[:, :, : rows.num_rows] = rows.keys
    out_v[:, :, : rows.num_rows] = rows.values
    out_pos = torch.full((B, H, N), -1, dtype=torch.long, device=dev)
    out_order = torch.full((B, H, N), -1, dtype=torch.long, device=dev)
    out_pos[:, :, : rows.num_rows] = rows.pos
    out_order[:, :, : rows.num_rows] = rows.order
    valid = valid.to(dev)
    rank = torch.cumsum(valid.long(), 1) - 1
    j = rows.n[:, :, None] + rank[:, None, :]  # [B, H, S]
    sel = valid[:, None, :].expand(B, H, S)
    b_idx = torch.arange(B, device=dev)[:, None, None].expand(B, H, S)[sel]
    h_idx = torch.arange(H, device=dev)[None, :, None].expand(B, H, S)[sel]
    jj = j[sel]
    out_k[b_idx, h_idx, jj] = keys.to(dev, out_k.dtype)[sel]
    out_v[b_idx, h_idx, jj] = values.to(dev, out_v.dtype)[sel]
    out_pos[b_idx, h_idx, jj] = pos.to(dev)[:, None, :].expand(B, H, S)[sel]
    out_order[b_idx, h_idx, jj] = order.to(dev)[:, None, :].expand(B, H, S)[sel]
    n_valid = torch.arange(N, device=dev)[None, None, :] < n_new[:, :, None]
    return Rows(out_k, out_v, out_pos, out_order, n_valid, n_new)


@dataclass
class _HostRows:
    keys: torch.Tensor
    values: torch.Tensor
    pos: torch.Tensor
    order: torch.Tensor
    valid: torch.Tensor

    def pin(self) -> _HostRows:
        return _HostRows(
            *(t.pin_memory() for t in (self.keys, self.values, self.pos, self.order, self.valid))
        )

    def to(self, device: torch.device, non_blocking: bool = False) -> Rows:
        t = [x.to(device, non_blocking=non_blocking) for x in (self.keys, self.values, self.pos, self.order)]
        valid = self.valid.to(device, non_blocking=non_blocking)
        return Rows(*t, valid, valid.sum(-1))


def gather_rows(store: PagedKV, idx: torch.Tensor) -> _HostRows:
    """Rows ``idx [B, N]`` (-1 = padding; the same rows for every KV head) of a store that never evicts,
    gathered where the store lives (a copy), ready for ``.to(device)``."""
    d = store.head_dim
    idx = idx.to(store.device)
    B, N = idx.shape
    H = store.heads
    valid = (idx >= 0)[:, None, :].expand(B, H, N)
    if N == 0:
        empty = torch.zeros(B, H, 0, dtype=torch.long, device=store.device)
        kv = torch.zeros(B, H, 0, d, dtype=store.dtype, device=store.device)
        return _HostRows(kv, kv.clone(), empty, empty.clone(), valid.contiguous())
    j = idx.clamp_min(0)
    flat = store.flat_index()[0].gather(2, j[:, None, :].expand(B, H, N))  # [B, H, N] row ids in the buffers
    neg = torch.full((), -1, dtype=torch.long, device=store.device)
    return _HostRows(
        store.k.view(-1, d)[flat],
        store.v.view(-1, d)[flat],
        store.pos.view(-1)[flat].where(valid, neg),
        store.order.view(-1)[flat].where(valid, neg),
        valid.contiguous(),
    )


class HostRowsMixin(PolicyCache):
    """Stores on host; the attention of layer l reads a device copy made in ``load_rows`` (prefetched).

    Which rows: :meth:`attended_rows` (override it) names the held rows attention needs; the mixin gathers
    them on the host, copies them to the device (layer l+1's copy issued while layer l computes, when
    ``prefetch_rows``) and appends the step's own new rows, which come straight from the attention module.
    """

    store_role = "host"
    prefetch_rows = True

    def attended_rows(self, layer: PolicyLayer) -> torch.Tensor | None:
        """Which held rows this step's attention reads at ``layer``, besides the step's own tokens: ``[B, N]``
        row indices in insertion order (-1 = padding), the same for every KV head, or None for every row.
        Called for the prefetch (before the step's rows reach ``layer``) and at its ``update`` (after they
        were appended), so count the held rows in ``on_step_begin``, not from ``layer.store.n``."""
        return None

    def store_device(self, compute_device: torch.device) -> torch.device:
        return torch.device("cpu")

    def _stream(self):
        if self.compute_device is not None and self.compute_device.type == "cuda":
            if getattr(self, "_side_stream", None) is None:
                self._side_stream = torch.cuda.Stream(self.compute_device)
            return self._side_stream
        return None

    def _prefetch(self, layer: PolicyLayer, device: torch.device) -> None:
        """Start copying ``layer``'s attended rows to ``device`` (before its new rows arrive): a side CUDA
        stream, or a plain copy on a CPU."""
        if layer.store is None:
            return
        idx = self.attended_rows(layer)
        stream = self._stream()
        layer.state["prefetched_version"] = layer.store.version
        if stream is None:
            rows = layer.store.rows(device=device) if idx is None else gather_rows(layer.store, idx).to(device)
            layer.state["prefetched"] = rows
            return
        stream.wait_stream(torch.cuda.current_stream(device))
        if idx is None:
            with torch.cuda.stream(stream):
                layer.state["prefetched"] = layer.store.rows(device=device, non_blocking=True)
            return
        host = gather_rows(layer.store, idx).pin()
        with torch.cuda.stream(stream):
            layer.state["prefetched"] = host.to(device, non_blocking=True)
        layer.state["prefetch_source"] = host  # the pinned source must outlive the asynchronous copy

    def _take_prefetched(self, layer: PolicyLayer, device: torch.device) -> Rows | None:
        """The prefetched copy of ``layer``'s rows if it is still current (only this step's rows were added)."""
        pre = layer.state.pop("prefetched", None)
        version = layer.state.pop("prefetched_version", None)
        layer.state.pop("prefetch_source", None)
        appended = int(self.step.valid.any())  # append() bumps the version only when something was stored
        if pre is None or layer.store.version != version + appended:
            return None
        stream = self._stream()
        if stream is not None:
            current = torch.cuda.current_stream(device)
            current.wait_stream(stream)
            for t in (pre.keys, pre.values, pre.pos, pre.order, pre.valid, pre.n):
                t.record_stream(current)  # allocated on the side stream, freed on this one
        return pre

    def load_rows(self, layer: PolicyLayer, device: torch.device) -> Rows:
        """The attended rows of ``layer`` on ``device``, plus this step's own tokens."""
        step = self.step
        old = self._take_prefetched(layer, device)
        idx = None if old is not None else self.attended_rows(layer)
        if self.prefetch_rows and layer.idx + 1 < self.num_layers:
            self._prefetch(self.layers[layer.idx + 1], device)
        if old is None and idx is None:
            return layer.store.rows(device=device)  # every row, this step's included
        if old is None:
            old = gather_rows(layer.store, idx).to(device)
        k_new, v_new = layer.incoming
        return extend_rows(old, k_new, v_new, step.positions, step.order, step.valid)


@dataclass
class OffloadConfig(PolicyConfig):
    """Full KV cache held on host memory; only the current layer's rows are brought to the device."""

    prefetch: bool = True  # copy layer l+1's rows on a side stream while layer l computes (CUDA only)


@register_policy("offload", OffloadConfig)
class OffloadCache(HostRowsMixin):
    def __init__(self, config: OffloadConfig, model_config, tokenizer=None) -> None:
        super().__init__(config, model_config, tokenizer)
        self.prefetch_rows = config.prefetch
