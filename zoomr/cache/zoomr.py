"""ZoomR: multi-granularity KV retrieval for long reasoning (ZoomR §3.3-3.4, Algorithm 1, A.3); SumR ablation.

The model writes ``<|begin_of_summary|> … <|end_of_summary|>`` after each paragraph (see train/zoomr_sft.py).
This policy never discards a row: the full KV stays in the layer stores (host memory when ``offload``),
and each step's attention reads only the selected context

    I_f = prompt ∪ recent window ∪ ⋃_{i ∈ I_c} R_i ∪ ⋃_{i ∈ I_s} S_i   (+ every row generated since).

- Segments R_i / S_i come from the fed token ids (:class:`zoomr.segments.SegmentTracker`), positions = rows
  (ZoomR neither evicts nor inserts rows, so row j of a sequence is its token at position j). Malformed
  delimiters follow the tracker's rule (a ``<|begin_of_summary|>`` inside a summary restarts it, a lone
  ``<|end_of_summary|>`` is ignored, an unclosed summary never becomes a segment); the first in a sequence is logged.
- When S_i completes, its mean post-RoPE key k̄_i per (layer, KV head) is computed once and kept on the
  compute device (``kbar``).
- At a recompute step (the fed token is a semantic boundary, A.3), every (layer, query head) scores
  α_i = q_t · k̄_i with its KV head's k̄ and votes for its top-k summaries; I_all = every voted summary,
  v_i = its votes, I_c = the ``consensus`` most voted (ties: the later segment), I_s = I_all minus I_c,
  AG = Σ_{I_c} v_i / Σ_{I_all} v_i (logged). The new I_f applies from the next step on; between
  recomputes it is frozen and newly generated rows are appended to it.
- Offload (§3.4), built on the cache library's :class:`~zoomr.cache.offload.HostRowsMixin`: the stores live
  in (pinned) host memory; each layer's I_f rows are gathered on the host and copied to the device, the
  next layer's copy issued (on a side CUDA stream) while this layer computes; the step's own new rows come
  straight from the attention module. On a CPU the same path runs with plain copies, and ``offload=False``
  keeps the stores on the device: outputs are identical in all three cases.

Resident rows (``resident_rows``) are |I_f| per (layer, sequence, KV head): the rows the next step's
attention reads besides its own token. ``recompute_log[sequence]`` holds one record per recompute.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from zoomr import tokens
from zoomr.cache.base import PolicyCache, PolicyLayer, Step
from zoomr.cache.config import PolicyConfig
from zoomr.cache.offload import HostRowsMixin
from zoomr.cache.registry import register_policy
from zoomr.cache.store import PagedKV
from zoomr.schemas.checks import is_integer
from zoomr.segments import Segment, SegmentTracker, boundary_table

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------- voting


def head_votes(
    query: torch.Tensor, kbar: torch.Tensor, n_summaries: torch.Tensor, top_k: int
) -> torch.Tensor:
    """Votes per summary from one layer: ``query [B, Hq, d]``, ``kbar [B, Hkv, M, d]``, ``n_summaries [B]``.

    Each query head h scores α_i = q_h · k̄_i with its KV head's mean keys (GQA: h // (Hq / Hkv)) and votes
    for its top-k among the sequence's ``n_summaries`` summaries. Returns ``[B, M]`` vote counts.
    """
    B, Hq, d = query.shape
    Hkv, M = kbar.shape[1], kbar.shape[2]
    votes = torch.zeros(B, M, dtype=torch.long, device=kbar.device)
    if M == 0:
        return votes
    g = Hq // Hkv
    alpha = torch.einsum("bkgd,bkmd->bkgm", query.reshape(B, Hkv, g, d).to(kbar.dtype), kbar).reshape(
        B, Hq, M
    )
    live = torch.arange(M, device=kbar.device)[None, :] < n_summaries.to(kbar.device)[:, None]  # [B, M]
    alpha = alpha.float().masked_fill(~live[:, None, :], float("-inf"))
    top = alpha.topk(min(top_k, M), dim=-1)
    picked = torch.isfinite(top.values)  # a head cannot vote for a summary that does not exist yet
    votes.scatter_add_(1, top.indices.reshape(B, -1), picked.reshape(B, -1).long())
    return votes


@dataclass
class Consensus:
    """Outcome of one recompute for one sequence (ZoomR §3.3 "Global Aggregation and Consensus")."""

    votes: dict[int, int]  # v_i for i in I_all
    zoomed: list[int]  # I_c
    summarized: list[int]  # I_s
    agreeability: float | None  # AG; None when nobody voted (no summary yet)


def consensus(votes: torch.Tensor, c: int) -> Consensus:
    """I_all, I_c (top-c by votes, ties broken toward the later segment), I_s and AG from ``votes [M]``."""
    v = votes.tolist()
    voted = [i for i, n in enumerate(v) if n > 0]
    ranked = sorted(voted, key=lambda i: (v[i], i), reverse=True)
    zoomed = sorted(ranked[:c])
    summarized = sorted(ranked[c:])
    total = sum(v[i] for i in voted)
    ag = sum(v[i] for i in zoomed) / total if total else None
    return Consensus({i: v[i] for i in voted}, zoomed, summarized, ag)


# --------------------------------------------------------------------------------------------- policy


@dataclass
class ZoomRConfig(PolicyConfig):
    """ZoomR decoding (ZoomR §3.3-3.4, Algorithm 1); SumR is ``consensus=0, summaries=all``.

    - ``top_k``: summaries each (layer, query head) votes for with q_t · k̄_i; ``consensus`` (c): the
      most-voted summaries whose regular segments R_i are zoomed into (ties: the later segment).
    - ``summaries``: ``voted`` keeps S_i for i in I_all minus I_c (the paper); ``all`` keeps every summary
      (SumR: no retrieval at all). ``zoom_keeps_summary``: also keep S_i of zoomed segments (the paper
      keeps R_i only).
    - ``window`` (N_w): most recent rows kept at each recompute; the prompt is always kept whole.
    - ``recompute``: ``boundary`` (at semantic boundaries, A.3) or ``every`` step (ablation).
    - ``mean_key_delimiters``: average the delimiters' keys into k̄_i too (default: content tokens only).
    - ``vote_layers``: None, every layer votes (the paper); a list of layer indices is a variant in which only
      those layers vote (e.g. the testbed's 3-layer model, whose first layer cannot see the cue at ``:``).
    - ``offload``: the full KV lives in (pinned) host memory and only I_f is brought to the device,
      layer by layer (``prefetch``: the next layer's rows are copied on a side stream, CUDA only).
    """

    top_k: int = 2
    consensus: int = 2
    window: int = 512
    summaries: str = "voted"
    zoom_keeps_summary: bool = False
    recompute: str = "boundary"
    mean_key_delimiters: bool = False
    vote_layers: list[int] | None = None
    offload: bool = True
    prefetch: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        layers = self.vote_layers
        if layers is not None and (
            not isinstance(layers, list | tuple) or not layers
            or not all(is_integer(i) and i >= 0 for i in layers) or len(set(layers)) < len(layers)
        ):  # fmt: skip  (1.5 or "2" matched no layer: nobody voted, without a word)
            raise ValueError(
                "ZoomRConfig: vote_layers must be null or a non-empty list of distinct layer indices (ints >= 0), "
                f"got {layers!r}"
            )
        if self.top_k < 1 or self.consensus < 0 or self.window < 0:
            raise ValueError(
                f"ZoomRConfig: need top_k >= 1, consensus >= 0, window >= 0; got "
                f"{self.top_k}, {self.consensus}, {self.window}"
            )
        if self.summaries not in ("voted", "all"):
            raise ValueError(f"ZoomRConfig: summaries must be voted|all, got {self.summaries!r}")
        if self.recompute not in ("boundary", "every"):
            raise ValueError(f"ZoomRConfig: recompute must be boundary|every, got {self.recompute!r}")


@register_policy("zoomr", ZoomRConfig)
class ZoomRCache(HostRowsMixin):
    """ZoomR / SumR (``consensus=0, summaries=all``). Needs the tokenizer (delimiters, boundaries) and the
    token ids of every step: decode with :func:`zoomr.engine.generate`, or call ``begin_step(valid,
    input_ids=...)`` / ``end_step()`` around each forward."""

    _bytes_skip = (*PolicyCache._bytes_skip, "boundary", "trackers", "recompute_log")

    def __init__(self, config: ZoomRConfig, model_config: Any, tokenizer: Any = None) -> None:
        super().__init__(config, model_config, tokenizer)
        self.store_role = "host" if config.offload else "device"
        self.boundary: torch.Tensor | None = None  # [vocab] bool, built from the tokenizer on first use
        self.begin_id = self.end_id = -1
        self.trackers: list[SegmentTracker] | None = None
        self.seq_ids: list[int] = []
        self.prompt_len: torch.Tensor | None = None  # [B]
        self.sel: list[torch.Tensor] = []  # per sequence: selected rows below ``frozen`` (sorted)
        self.frozen: torch.Tensor | None = None  # [B]: rows at or after this are always visible
        self.kbar: list[torch.Tensor | None] = [None] * self.num_layers  # [B, Hkv, cap, d] per layer
        if self.config.vote_layers is not None and max(self.config.vote_layers) >= self.num_layers:
            raise ValueError(f"zoomr: vote_layers={self.config.vote_layers}, but the model has layers 0..{self.num_layers - 1}")
        self.n_summ: torch.Tensor | None = None  # [B]
        self.recompute_log: dict[int, list[dict[str, Any]]] = {}
        self._completed: list[tuple[int, Segment]] = []
        self._recompute: torch.Tensor | None = None  # [B] bool, this step
        self._votes: torch.Tensor | None = None  # [B, cap], this step
        self._old_idx: torch.Tensor | None = None  # [B, N] rows read from the stores this step (-1 pad)
        self._n_old: torch.Tensor | None = None  # [B] rows held before this step's tokens (host-side copy)
        self.prefetch_rows = bool(config.offload and config.prefetch)
        if tokenizer is not None:
            self._delimiter_ids()

    # ------------------------------------------------------------------ setup
    def _delimiter_ids(self) -> None:
        """The summary delimiters' ids; a tokenizer without them is refused (checked when the policy is built, so
        ``python -m eval`` refuses before writing anything: it was a ValueError at the first decode step)."""
        vocab = self.tokenizer.get_vocab()
        missing = [t for t in tokens.SUMMARY_TAGS if t not in vocab]
        if missing:
            raise ValueError(
                f"tokenizer lacks the summary delimiters {missing}: fine-tune with +method=zoomr_sft"
            )
        self.begin_id, self.end_id = (vocab[t] for t in tokens.SUMMARY_TAGS)

    def _ensure_vocab(self) -> None:
        if self.boundary is not None:
            return
        if self.tokenizer is None:
            raise ValueError("ZoomR needs the tokenizer (summary delimiters, semantic boundaries)")
        self._delimiter_ids()
        self.boundary = boundary_table(self.tokenizer)

    def store_device(self, compute_device: torch.device) -> torch.device:
        return super().store_device(compute_device) if self.config.offload else compute_device

    # ------------------------------------------------------------------ hooks
    def on_step_begin(self, step: Step) -> None:
        """Feed this step's tokens to the segment trackers; mark the sequences that recompute (a boundary)."""
        B = step.valid.shape[0]
        held = self._rows_held()
        self._n_old = held if held.numel() else torch.zeros(B, dtype=torch.long)  # rows before this step
        if self.trackers is None:
            self.seq_ids = list(range(B))
            self.recompute_log = {i: [] for i in range(B)}
        if step.is_prefill:
            return
        input_ids = step.input_ids
        if input_ids is None:
            raise RuntimeError(
                "ZoomR reads the generated tokens: decode with zoomr.engine.generate, or call "
                "cache.begin_step(valid, input_ids=...) before each forward (stock generate is not supported)"
            )
        self._ensure_vocab()
        ids, val, pos = input_ids.cpu(), step.valid.cpu(), step.positions.cpu()
        if self.trackers is None:  # first decode step: everything before it is the prompt
            first = torch.where(val.any(1), val.float().argmax(1), torch.zeros(B, dtype=torch.long))
            start = pos[torch.arange(B), first]
            self.prompt_len = start.clone()
            self.trackers = [SegmentTracker(self.begin_id, self.end_id, start=int(s)) for s in start]
            self.frozen = torch.zeros(B, dtype=torch.long)
            self.sel = [torch.zeros(0, dtype=torch.long) for _ in range(B)]
            self.n_summ = torch.zeros(B, dtype=torch.long)
        recompute = torch.zeros(B, dtype=torch.bool)
        for b in range(B):
            row = ids[b][val[b]].tolist()
            for tok, p in zip(row, pos[b][val[b]].tolist()):
                tracker = self.trackers[b]
                if tracker.length != p:
                    raise RuntimeError(
                        f"sequence {b}: token at position {p}, tracker expected {tracker.length}"
                    )
                before = tracker.anomalies
                seg = tracker.feed(tok)
                if seg is not None:
                    self._completed.append((b, seg))
                if tracker.anomalies and not before:  # the first malformed delimiter of this sequence: said once
                    rule = (
                        "the summary restarts there (what it held so far joins the paragraph)"
                        if tok == self.begin_id
                        else "it is ignored (it stays in the paragraph)"
                    )
                    log.warning(
                        "zoomr: sequence %d has %s at position %d %s: %s; later malformed delimiters of this "
                        "sequence are handled the same way without a word",
                        self.seq_ids[b], tokens.SUMMARY_TAGS[tok != self.begin_id], p,
                        "inside an open summary" if tok == self.begin_id else "with no summary open", rule,
                    )  # fmt: skip
            if row:  # an id past the tokenizer (the model's padded embedding rows) decodes to nothing: no boundary
                last = row[-1]
                recompute[b] = self.config.recompute == "every" or (
                    last < len(self.boundary) and bool(self.boundary[last])
                )
        self.n_summ = torch.tensor([len(t.segments) for t in self.trackers], dtype=torch.long)
        self._recompute = recompute
        self._votes = torch.zeros(B, max(int(self.n_summ.max()), 1), dtype=torch.long)

    def on_append(self, layer: PolicyLayer) -> None:
        """Mean post-RoPE keys of the summaries completed by this step's tokens, at this layer."""
        if not self._completed:
            return
        store = layer.store
        cap = int(self.n_summ.max())
        kbar = self._grow_kbar(layer.idx, cap, store)
        for b, seg in self._completed:
            content = seg.summary_content
            rows = seg.summary if self.config.mean_key_delimiters or len(content) == 0 else content
            keys = gather_sequence_keys(store, b, torch.tensor(list(rows), dtype=torch.long))  # [H, m, d]
            kbar[b, :, seg.index] = keys.float().mean(dim=1).to(kbar.device, kbar.dtype)

    def _grow_kbar(self, layer_idx: int, cap: int, store: PagedKV) -> torch.Tensor:
        kbar = self.kbar[layer_idx]
        device = self.compute_device or store.device
        if kbar is None or kbar.shape[2] < cap:
            width = max(cap, 4, 2 * (0 if kbar is None else kbar.shape[2]))
            dtype = self.dtype or store.dtype
            new = torch.zeros(store.batch, self.kv_heads, width, self.head_dim, dtype=dtype, device=device)
            if kbar is not None:
                new[:, :, : kbar.shape[2]] = kbar
            self.kbar[layer_idx] = kbar = new
        return kbar

    def on_queries(self, layer: PolicyLayer, query: torch.Tensor) -> None:
        """At a recompute step: this layer's heads vote with the boundary token's query."""
        if self._recompute is None or not bool(self._recompute.any()) or self.kbar[layer.idx] is None:
            return
        if self.config.vote_layers is not None and layer.idx not in self.config.vote_layers:
            return  # a variant: only the listed layers vote
        valid = self.step.valid
        last = valid.shape[1] - 1 - valid.flip(1).long().argmax(1)  # each sequence's last fed token
        q = query[torch.arange(query.shape[0], device=query.device), :, last.to(query.device)]  # [B, Hq, d]
        M = self._votes.shape[1]
        kbar = self.kbar[layer.idx][:, :, :M]
        if kbar.shape[2] < M:
            return
        with self.selecting():
            votes = head_votes(q, kbar, self.n_summ, self.config.top_k).cpu()
            self._votes += votes * self._recompute[:, None]

    def on_step_end(self, step: Step) -> None:
        self._completed = []
        self._old_idx = None
        if step.is_prefill or self._recompute is None:
            return
        with self.selecting():
            n = self._rows_held()
            for b in torch.nonzero(self._recompute).flatten().tolist():
                self._reselect(b, int(n[b]))
        self._recompute = None

    def _reselect(self, b: int, n: int) -> None:
        cfg = self.config
        tracker = self.trackers[b]
        m = len(tracker.segments)
        result = consensus(self._votes[b, :m], cfg.consensus)
        keep = torch.zeros(n, dtype=torch.bool)
        keep[: int(self.prompt_len[b])] = True
        keep[max(0, n - cfg.window) :] = True
        kept_summaries = (
            set(range(m)) - set(result.zoomed) if cfg.summaries == "all" else set(result.summarized)
        )
        if cfg.zoom_keeps_summary:
            kept_summaries |= set(result.zoomed)
        for i in result.zoomed:
            seg = tracker.segments[i]
            keep[seg.r_start : seg.r_end] = True
        for i in kept_summaries:
            seg = tracker.segments[i]
            keep[seg.s_start : seg.s_end] = True
        self.sel[b] = torch.nonzero(keep).flatten()
        self.frozen[b] = n
        self.recompute_log[self.seq_ids[b]].append(
            {
                "step": self.steps_done,
                "position": n - 1,
                "agreeability": result.agreeability,
                "votes": result.votes,
                "zoomed": result.zoomed,
                "summaries_kept": sorted(kept_summaries),
                "n_summaries": m,
                "rows": int(keep.sum()),
            }
        )

    # ------------------------------------------------------------------ rows read by attention
    def _rows_held(self) -> torch.Tensor:
        store = self.layers[0].store
        return store.n[:, 0].cpu() if store is not None else torch.zeros(0, dtype=torch.long)

    def _selected_old_rows(self, n_old: torch.Tensor) -> torch.Tensor:
        """``[B, N]`` store rows this step reads besides its own tokens (-1 = padding); shared by all layers."""
        if self._old_idx is not None:
            return self._old_idx
        per_b = []
        for b in range(n_old.shape[0]):
            if self.frozen is None:
                per_b.append(torch.arange(int(n_old[b])))
            else:
                per_b.append(torch.cat([self.sel[b], torch.arange(int(self.frozen[b]), int(n_old[b]))]))
        width = max((len(x) for x in per_b), default=0)
        idx = torch.full((len(per_b), width), -1, dtype=torch.long)
        for b, x in enumerate(per_b):
            idx[b, : len(x)] = x
        self._old_idx = idx
        return idx

    def attended_rows(self, layer: PolicyLayer) -> torch.Tensor:
        """Which rows: I_f, the same for every layer and KV head this step (HostRowsMixin gathers, copies and
        prefetches them, then appends the step's own tokens)."""
        return self._selected_old_rows(self._n_old)

    # ------------------------------------------------------------------ bookkeeping
    def resident_rows(self) -> torch.Tensor:
        """``[L, B, H]``: |I_f|, the rows the next step's attention reads from the cache (all layers and heads)."""
        n = self._rows_held()
        if self.frozen is None:
            counts = n
        else:
            counts = torch.tensor([len(self.sel[b]) + int(n[b] - self.frozen[b]) for b in range(len(n))])
        layers = sum(layer.store is not None for layer in self.layers)
        return counts[None, :, None].expand(layers, -1, self.kv_heads).clone()

    def on_select_batch(self, index: torch.Tensor) -> None:
        keep = index.cpu()
        self.seq_ids = [self.seq_ids[i] for i in keep.tolist()]
        if self.trackers is not None:
            self.trackers = [self.trackers[i] for i in keep.tolist()]
            self.sel = [self.sel[i] for i in keep.tolist()]
            self.frozen, self.prompt_len, self.n_summ = (
                self.frozen[keep],
                self.prompt_len[keep],
                self.n_summ[keep],
            )
        self.kbar = [k[index.to(k.device)] if k is not None else None for k in self.kbar]

    def summary(self) -> dict[str, float]:
        """Recompute statistics over every sequence: count, tokens between recomputes, mean AG and |I_f|."""
        logs = [r for rs in self.recompute_log.values() for r in rs]
        ags = [r["agreeability"] for r in logs if r["agreeability"] is not None]
        gaps = [
            b["position"] - a["position"] for rs in self.recompute_log.values() for a, b in zip(rs, rs[1:])
        ]
        return {
            "recomputes": len(logs),
            "tokens_between_recomputes": sum(gaps) / len(gaps) if gaps else float("nan"),
            "mean_agreeability": sum(ags) / len(ags) if ags else float("nan"),
            "mean_selected_rows": sum(r["rows"] for r in logs) / len(logs) if logs else float("nan"),
        }


# --------------------------------------------------------------------------------------------- gathering


def gather_sequence_keys(store: PagedKV, b: int, idx: torch.Tensor) -> torch.Tensor:
    """Keys ``[H, m, d]`` of rows ``idx [m]`` of sequence ``b`` (a store that never evicts: row = position)."""
    idx = idx.to(store.device)
    flat, _ = store.flat_index()
    return store.k.view(-1, store.head_dim)[flat[b][:, idx]]
