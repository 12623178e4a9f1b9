"""Full KV cache offloaded to host memory: only the current layer's rows are on the device.

Rows live in host stores (pinned when CUDA is available). In ``update`` the new rows are written to the host
store and the layer's rows are brought to the device for its attention; the device copy is dropped right
after. With ``prefetch`` the next layer's rows are copied while this layer computes (a side CUDA stream;
on a CPU-only machine the same code runs with plain copies), and the new rows are merged into the prefetched
copy. :class:`HostRowsMixin` is the reusable part: a policy whose full cache lives on host (ZoomR) can
subclass it and override :meth:`load_rows` to bring only a selected subset.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zoomr.cache.base import PolicyCache, PolicyLayer
from zoomr.cache.config import PolicyConfig
from zoomr.cache.registry import register_policy
from zoomr.cache.store import Rows


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


class HostRowsMixin(PolicyCache):
    """Stores on host; the attention of layer l reads a device copy made in ``load_rows`` (prefetched)."""

    store_role = "host"
    prefetch_rows = True

    def store_device(self, compute_device: torch.device) -> torch.device:
        return torch.device("cpu")

    def _stream(self):
        if self.compute_device is not None and self.compute_device.type == "cuda":
            if getattr(self, "_side_stream", None) is None:
                self._side_stream = torch.cuda.Stream(self.compute_device)
            return self._side_stream
        return None

    def _prefetch(self, layer: PolicyLayer, device: torch.device) -> None:
        """Start copying ``layer``'s current rows to ``device`` (before its new rows arrive)."""
        if layer.store is None:
            return
        stream = self._stream()
        layer.state["prefetched_version"] = layer.store.version
        if stream is None:
            layer.state["prefetched"] = layer.store.rows(device=device)
            return
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            layer.state["prefetched"] = layer.store.rows(device=device, non_blocking=True)

    def load_rows(self, layer: PolicyLayer, device: torch.device) -> Rows:
        pre = layer.state.pop("prefetched", None)
        version = layer.state.pop("prefetched_version", None)
        step = self.step
        appended = int(step.valid.any())  # append() bumps the version only when something was stored
        if pre is not None and layer.store.version == version + appended:
            stream = self._stream()
            if stream is not None:
                torch.cuda.current_stream(device).wait_stream(stream)
            new = self._new_tokens
            rows = extend_rows(pre, new[0], new[1], step.positions, step.order, step.valid)
        else:
            rows = layer.store.rows(device=device)
        if self.prefetch_rows and layer.idx + 1 < self.num_layers:
            self._prefetch(self.layers[layer.idx + 1], device)
        return rows

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self._new_tokens = (key_states, value_states)
        try:
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)
        finally:
            self._new_tokens = None


@dataclass
class OffloadConfig(PolicyConfig):
    """Full KV cache held on host memory; only the current layer's rows are brought to the device."""

    prefetch: bool = True  # copy layer l+1's rows on a side stream while layer l computes (CUDA only)


@register_policy("offload", OffloadConfig)
class OffloadCache(HostRowsMixin):
    def __init__(self, config: OffloadConfig, model_config, tokenizer=None) -> None:
        super().__init__(config, model_config, tokenizer)
        self.prefetch_rows = config.prefetch
