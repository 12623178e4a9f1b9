"""Batched decoding with any KV-cache policy, measuring what every step really kept.

Our own loop rather than ``model.generate``: each sequence of a left-padded batch gets positions
0..n-1 over its own tokens, pads are never stored, and the attention mask is built per (sequence, KV head)
from the rows the policy holds — so a batch decodes exactly like its prompts one by one, eviction included.
Finished sequences leave the batch (their rows are freed). A policy may ask for forced tokens (pause /
cache tokens) that run alongside other sequences' ordinary decode tokens; their outputs are not sampled.
A *script* lets an environment write some response tokens (tool outputs, observations, the testbed's
random facts): at a scripted position the environment's token replaces the model's sample and is then
decoded like any other (one step, seen and evicted by the policy); at ``None`` positions the model writes.

    outs = generate(model, tokenizer, prompts, build_policy(cfg.method, model.config, tokenizer),
                    DecodeSettings(max_new_tokens=512, temperature=0.6, top_p=0.95, top_k=20, seed=1234))
    outs[0].text, outs[0].n_tokens, outs[0].hit_cap, outs[0].stats.rows  # [steps, layers, kv heads]
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from zoomr.attention import ATTN_IMPLEMENTATION
from zoomr.cache import ForcedInput, PolicyCache, build_policy
from zoomr.cache.base import attention_shape
from zoomr.decode_forward import DecoderForward

log = logging.getLogger(__name__)


@dataclass
class DecodeSettings:
    """Sampling and stopping. ``temperature=0`` is greedy. ``seed``: one int (sequence i uses seed + i) or a
    list (one per prompt), so a sequence samples the same tokens alone or in any batch."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | list[int] = 0
    stop_strings: list[str] = field(default_factory=list)
    stop_token_ids: list[int] | None = None  # None: the tokenizer's / model's EOS ids
    prefill_chunk: int | None = None  # prefill in chunks of this many tokens (policies may evict between)
    stats_every: int = 1  # record per-step stats every k decode steps (and always the last)
    progress: bool = True

    def __post_init__(self) -> None:
        self._check_types()
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0 <= self.temperature < float("inf") or not 0 < self.top_p <= 1 or self.top_k < 0:  # NaN fails too
            raise ValueError(
                f"bad sampling settings: T={self.temperature}, top_p={self.top_p}, top_k={self.top_k}"
                " (need a finite temperature >= 0, 0 < top_p <= 1, top_k >= 0)"
            )
        if self.prefill_chunk is not None and self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {self.prefill_chunk}")
        if self.stats_every < 1:
            raise ValueError(f"stats_every must be >= 1, got {self.stats_every}")

    def _check_types(self) -> None:
        """Refuse values of the wrong type by field: a float token cap or top-k (2.5 decoded 3 tokens, and top_k a
        torch TypeError), ``temperature=True``, ``stop_strings="\\n\\n"`` (its characters became the stop strings), an
        empty stop string (every sample stopped after one token) and ``stop_token_ids=2`` (a TypeError)."""
        wrong = []
        for name in ("max_new_tokens", "top_k", "stats_every", "prefill_chunk"):
            value = getattr(self, name)
            if not (_integer(value) or (name == "prefill_chunk" and value is None)):
                wrong.append(f"{name}={value!r} (must be an int)")
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Real):
                wrong.append(f"{name}={value!r} (must be a number)")
        seeds = self.seed if isinstance(self.seed, list | tuple) else [self.seed]
        if not all(_integer(x) for x in seeds):
            wrong.append(f"seed={self.seed!r} (must be an int or a list of ints, one per prompt)")
        stops = self.stop_strings
        if not isinstance(stops, list | tuple) or not all(isinstance(x, str) and x for x in stops):
            wrong.append(f"stop_strings={stops!r} (must be a list of non-empty strings)")
        ids = self.stop_token_ids
        if ids is not None and (not isinstance(ids, list | tuple) or not all(_integer(x) and x >= 0 for x in ids)):
            wrong.append(f"stop_token_ids={ids!r} (must be null or a list of token ids >= 0)")
        if wrong:
            raise ValueError("DecodeSettings: " + "; ".join(wrong))


def _integer(value: Any) -> bool:
    """An integer that is not a bool (numpy's integers too)."""
    return isinstance(value, Integral) and not isinstance(value, bool)


@dataclass
class StepStats:
    """Per recorded step (row 0 = after prefill) of one sequence."""

    step: np.ndarray  # [T] decode step index (0 = prefill)
    rows: np.ndarray  # [T, L, H] rows this sequence holds per layer and KV head
    kv_bytes: np.ndarray  # [T] bytes of this sequence's K/V pages on the device
    kv_bytes_host: np.ndarray  # [T] ... on host (offloading policies)
    device_bytes: np.ndarray  # [T] every tensor the batch's cache holds on the device (measured)
    host_bytes: np.ndarray  # [T] ... on host
    batch_size: np.ndarray  # [T] sequences in the batch at that step (to share the batch totals)
    select_s: np.ndarray  # [T] seconds the policy spent selecting during the step (batch-wide)
    step_s: np.ndarray  # [T] wall time of the step's forward (batch-wide)

    @property
    def mean_rows(self) -> float:
        """Mean rows per (layer, KV head) over recorded decode steps (prefill excluded when there are any)."""
        rows = self.rows[1:] if len(self.rows) > 1 else self.rows
        return float(rows.mean()) if rows.size else 0.0


@dataclass
class SequenceOutput:
    index: int
    text: str
    token_ids: list[int]
    n_tokens: int
    prompt_tokens: int
    hit_cap: bool
    stop_reason: str  # eos | stop_string | length
    n_forced: int
    stats: StepStats
    n_scripted: int = 0  # response tokens written by the script, not the model

    def summary(self) -> dict[str, Any]:
        return {
            "n_tokens": self.n_tokens,
            "hit_cap": self.hit_cap,
            "stop_reason": self.stop_reason,
            "n_forced": self.n_forced,
            "n_scripted": self.n_scripted,
            "mean_rows": self.stats.mean_rows,
            "peak_kv_bytes": int(self.stats.kv_bytes.max()) if self.stats.kv_bytes.size else 0,
            "select_s": float(self.stats.select_s.sum()),
        }


def mean_rows(outputs: Sequence[SequenceOutput]) -> float:
    """Mean resident rows per (layer, KV head, sequence, decode step): the budget to give a matched baseline."""
    return float(np.mean([o.stats.mean_rows for o in outputs])) if outputs else 0.0


# --------------------------------------------------------------------------------------------- sampling


def sample_token(logits: torch.Tensor, s: DecodeSettings, generator: torch.Generator | None) -> int:
    """One token from ``logits [V]``: greedy at T=0, else temperature, top-k, then top-p (nucleus)."""
    if s.temperature == 0:
        return int(torch.argmax(logits))
    logits = logits.float() / s.temperature
    if s.top_k:
        kth = torch.topk(logits, min(s.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, -1)
        drop = torch.cumsum(probs, -1) - probs > s.top_p  # keep the smallest prefix reaching top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    probs = torch.softmax(logits, -1)
    return int(torch.multinomial(probs, 1, generator=generator))


def sample_tokens(
    logits: torch.Tensor, cols: list[int], s: DecodeSettings, generators: list[torch.Generator | None]
) -> list[int]:
    """One token per batch row from ``logits [B, Q, V]`` at column ``cols[r]`` (greedy: one argmax for the batch)."""
    if s.temperature == 0:
        if any(cols):
            picked = logits[
                torch.arange(logits.shape[0], device=logits.device), torch.tensor(cols, device=logits.device)
            ]
        else:
            picked = logits[:, 0]
        return picked.argmax(-1).tolist()
    return [sample_token(logits[r, c], s, g) for r, (c, g) in enumerate(zip(cols, generators))]


# --------------------------------------------------------------------------------------------- helpers


@contextmanager
def _attached(cache: PolicyCache, model: torch.nn.Module):
    """Install the policy's model-level hooks (:meth:`PolicyCache.attach`) for the run, then remove them."""
    handles = cache.attach(model)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def _policy_attention(model: torch.nn.Module):
    """Run the model with the ``zoomr`` attention implementation, restoring the previous one after."""
    previous = model.config._attn_implementation
    if previous != ATTN_IMPLEMENTATION:
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
    try:
        yield
    finally:
        if previous != ATTN_IMPLEMENTATION:
            model.set_attn_implementation(previous)


def _stop_ids(tokenizer: Any, model: Any, settings: DecodeSettings) -> set[int]:
    if settings.stop_token_ids is not None:
        return set(settings.stop_token_ids)
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        eos = getattr(source, "eos_token_id", None)
        ids.update(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    return ids


class _Recorder:
    """Accumulates one sequence's per-step stats."""

    def __init__(self) -> None:
        self.cols: dict[str, list] = {k: [] for k in StepStats.__dataclass_fields__}

    def add(self, **values: Any) -> None:
        for k, v in values.items():
            self.cols[k].append(v)

    def build(self) -> StepStats:
        arrays = {k: np.asarray(v) for k, v in self.cols.items()}
        if not len(arrays["rows"]):
            arrays["rows"] = np.zeros((0, 0, 0), dtype=np.int32)
        return StepStats(**arrays)


# --------------------------------------------------------------------------------------------- generate


def _pad(ids: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad the prompts into ``input_ids [B, S]`` and ``valid [B, S]`` (pads are never stored)."""
    B, S = len(ids), max(len(p) for p in ids)
    input_ids = torch.full((B, S), pad_id, dtype=torch.long)
    valid = torch.zeros(B, S, dtype=torch.bool)
    for b, p in enumerate(ids):
        input_ids[b, S - len(p) :] = torch.tensor(p)
        valid[b, S - len(p) :] = True
    return input_ids.to(device), valid.to(device)


class _Decode:
    """One :func:`generate` call: the batch's sequences, and the steps that decode them.

    ``active`` maps the cache's batch rows to sequence indices; ``pending[r]`` is the token just sampled for
    row ``r``. The steps, in the order :func:`generate` runs them: :meth:`prefill`, then per token
    :meth:`account` (append the sampled tokens, find finished sequences), :meth:`drop_finished` (they leave
    the cache) and :meth:`step` (one forward, one sample), and :meth:`finish` (the outputs).
    """

    def __init__(self, model, tokenizer, cache: PolicyCache, ids: list[list[int]], settings: DecodeSettings,
                 script: Sequence[Sequence[int | None]] | None) -> None:  # fmt: skip
        B = len(ids)
        self.model, self.tokenizer, self.cache, self.ids, self.s, self.script = (
            model, tokenizer, cache, ids, settings, script
        )  # fmt: skip
        self.device = next(model.parameters()).device
        self.decoder = DecoderForward(model)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        seeds = settings.seed if isinstance(settings.seed, list) else [settings.seed + i for i in range(B)]
        if len(seeds) != B:
            raise ValueError(f"{len(seeds)} seeds for {B} prompts")
        if script is not None and len(script) != B:
            raise ValueError(f"{len(script)} scripts for {B} prompts")
        self.gens = (
            [torch.Generator(device=self.device).manual_seed(int(sd)) for sd in seeds]
            if settings.temperature
            else [None] * B
        )
        self.stop_ids = _stop_ids(tokenizer, model, settings)
        self.tail = 2 + max(
            (len(tokenizer(s, add_special_tokens=False).input_ids) for s in settings.stop_strings), default=0
        )
        self.out_ids: list[list[int]] = [[] for _ in range(B)]
        self.n_forced = [0] * B
        self.n_scripted = [0] * B
        self.reason: list[str | None] = [None] * B
        self.rec = [_Recorder() for _ in range(B)]
        self.active = list(range(B))
        self.step_index = 0

    # ---- one forward and its stats
    def forward(self, step_ids: torch.Tensor, step_valid: torch.Tensor, positions: torch.Tensor | None = None,
                prefill: bool = False, last_chunk: bool = False, keep_last: bool = False):  # fmt: skip
        """Run the model on one step the cache was told about; returns (logits, seconds of the forward)."""
        cache = self.cache
        step = cache.begin_step(
            step_valid, positions=positions, input_ids=step_ids, is_prefill=prefill, ends_prefill=last_chunk
        )
        t0 = time.perf_counter()
        logits = self.decoder(step_ids, step.positions, cache, keep_last=keep_last)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        dt = time.perf_counter() - t0
        cache.end_step()
        return logits, dt

    def record(self, dt: float, force: bool = False) -> None:
        """Append this step's rows, bytes and times to every active sequence's stats (every ``stats_every``)."""
        if not force and self.step_index % self.s.stats_every:
            return
        cache = self.cache
        rows = cache.resident_rows()  # [L, B, H]
        held = cache.resident_bytes()
        seq = cache.sequence_kv_bytes()
        sel = cache.pop_select_seconds()
        rows_np = rows.numpy().astype(np.int32)
        dev_kv = seq["device"].tolist() if "device" in seq else [0] * len(self.active)
        host_kv = seq["host"].tolist() if "host" in seq else [0] * len(self.active)
        for r, i in enumerate(self.active):
            self.rec[i].add(
                step=self.step_index,
                rows=rows_np[:, r, :],
                kv_bytes=int(dev_kv[r]),
                kv_bytes_host=int(host_kv[r]),
                device_bytes=held["device"],
                host_bytes=held["host"],
                batch_size=len(self.active),
                select_s=sel,
                step_s=dt,
            )

    def sample(self, logits: torch.Tensor, cols: list[int]) -> list[int]:
        return sample_tokens(logits, cols, self.s, [self.gens[i] for i in self.active])

    # ---- the steps
    def prefill(self) -> list[int]:
        """Feed the padded prompts (in chunks of ``prefill_chunk``: a policy may evict between them) and sample
        each sequence's first token."""
        input_ids, valid = _pad(self.ids, self.pad_id, self.device)
        S = input_ids.shape[1]
        chunk = self.s.prefill_chunk or S
        t_prefill = 0.0
        for start in range(0, S, chunk):
            sl = slice(start, min(S, start + chunk))
            logits, dt = self.forward(
                input_ids[:, sl], valid[:, sl], prefill=True, last_chunk=sl.stop == S, keep_last=True
            )
            t_prefill += dt
        self.record(t_prefill, force=True)
        return self.sample(logits[:, -1][:, None], [0] * len(self.active))

    def account(self, pending: list[int]) -> list[int]:
        """Append each active sequence's sampled token (or the script's, where it writes) and mark the
        sequences that stop on it (EOS, a stop string, the token cap). Returns the tokens appended."""
        s, script = self.s, self.script
        pending = list(pending)
        for r, i in enumerate(self.active):
            out = self.out_ids[i]
            t = len(out)
            if script is not None and t < len(script[i]) and script[i][t] is not None:
                pending[r] = int(script[i][t])
                self.n_scripted[i] += 1
            tok = pending[r]
            out.append(tok)
            if tok in self.stop_ids:
                self.reason[i] = "eos"
            elif s.stop_strings and any(
                x in self.tokenizer.decode(out[-self.tail :], skip_special_tokens=False)
                for x in s.stop_strings
            ):
                self.reason[i] = "stop_string"
            elif len(out) >= s.max_new_tokens:
                self.reason[i] = "length"
        return pending

    def drop_finished(self, pending: list[int]) -> tuple[list[int], dict[int, ForcedInput]] | None:
        """Ask the policy for forced inputs, then let finished sequences leave the cache (their rows are
        freed). Returns the remaining rows' (pending tokens, forced inputs), or None when every sequence is done."""
        cache, active = self.cache, self.active
        forced = cache.forced_inputs(
            [pending[r] if self.reason[i] is None else None for r, i in enumerate(active)]
        )
        rows_left = [r for r, i in enumerate(active) if self.reason[i] is None]
        if not rows_left:
            return None
        if len(rows_left) < len(active):
            cache.select_batch(torch.tensor(rows_left, device=self.device))
            forced = {rows_left.index(r): f for r, f in forced.items() if r in rows_left}
            pending = [pending[r] for r in rows_left]
            self.active = [active[r] for r in rows_left]
        return pending, forced

    def _feed(self, pending: list[int], forced: dict[int, ForcedInput]) -> tuple[torch.Tensor, ...]:
        """``(step_ids, step_valid, positions)`` of one step: [pending token, forced tokens...] per sequence."""
        B = len(self.active)
        if not forced:  # plain decoding: one token per sequence
            step_ids = torch.tensor(pending, dtype=torch.long).view(-1, 1)
            step_valid = torch.ones(B, 1, dtype=torch.bool)
        else:
            feeds = [[pending[r], *(forced[r].token_ids if r in forced else [])] for r in range(B)]
            Q = max(len(f) for f in feeds)
            step_ids = torch.full((B, Q), self.pad_id, dtype=torch.long)
            step_valid = torch.zeros(B, Q, dtype=torch.bool)
            for r, f in enumerate(feeds):
                step_ids[r, : len(f)] = torch.tensor(f)
                step_valid[r, : len(f)] = True
                self.n_forced[self.active[r]] += len(f) - 1
        step_ids, step_valid = step_ids.to(self.device), step_valid.to(self.device)
        positions = self.cache.next_positions(step_valid)
        for r, f in forced.items():
            if f.positions is not None:
                if len(f.positions) != len(f.token_ids):
                    raise ValueError(
                        f"forced input: {len(f.positions)} positions for {len(f.token_ids)} tokens"
                    )
                positions[r, 1 : 1 + len(f.positions)] = torch.tensor(f.positions, device=self.device)
        return step_ids, step_valid, positions

    def step(self, pending: list[int], forced: dict[int, ForcedInput]) -> list[int]:
        """One decode forward over every active sequence; returns the tokens sampled from it."""
        step_ids, step_valid, positions = self._feed(pending, forced)
        logits, dt = self.forward(step_ids, step_valid, positions=positions)
        self.step_index += 1
        cols = [
            len(forced[r].token_ids) if r in forced and forced[r].sample_from_last else 0
            for r in range(len(self.active))
        ]
        pending = self.sample(logits, cols)
        self.record(dt)
        return pending

    def finish(self) -> list[SequenceOutput]:
        """Every sequence's text (EOS dropped, cut after a stop string), tokens, stop reason and stats."""
        outputs = []
        for i, toks in enumerate(self.out_ids):
            reason = self.reason[i]
            text = self.tokenizer.decode(toks[:-1] if reason == "eos" else toks, skip_special_tokens=False)
            if reason == "stop_string":
                stops = self.s.stop_strings
                text = text[: min((text.find(x) + len(x) for x in stops if x in text), default=len(text))]
            outputs.append(
                SequenceOutput(
                    index=i,
                    text=text,
                    token_ids=toks,
                    n_tokens=len(toks),
                    prompt_tokens=len(self.ids[i]),
                    hit_cap=reason == "length",
                    stop_reason=reason or "length",
                    n_forced=self.n_forced[i],
                    stats=self.rec[i].build(),
                    n_scripted=self.n_scripted[i],
                )
            )
        return outputs


def _check_token_ids(model: torch.nn.Module, ids: list[list[Any]], script: Sequence[Sequence[Any]] | None) -> None:
    """Refuse a prompt or script token that is not an id of the model's embedding (an IndexError from deep in
    torch's embedding otherwise; a float id was truncated without a word)."""
    vocab = model.get_input_embeddings().num_embeddings
    for what, rows in (("prompt", ids), ("script", script or [])):
        for i, row in enumerate(rows):
            for t in row:
                if (t is not None or what == "prompt") and not (_integer(t) and 0 <= t < vocab):
                    raise ValueError(f"{what} {i}: {t!r} is not a token id of this model (ints in [0, {vocab}))")


def position_limit(model_config: Any) -> int | None:
    """``max_position_embeddings`` when the model's RoPE is unscaled (positions past it were never trained), None
    when it has none or scales RoPE (``rope_parameters`` / ``rope_scaling`` of another type than ``default``)."""
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    limit = getattr(text, "max_position_embeddings", None)
    rope = getattr(text, "rope_parameters", None) or getattr(text, "rope_scaling", None) or {}
    per_kind = [v for v in rope.values() if isinstance(v, dict)] or [rope]  # per attention type (full, sliding)
    scaled = any(r.get("rope_type", r.get("type", "default")) != "default" for r in per_kind)
    return limit if isinstance(limit, int) and not scaled else None


def _warn_past_positions(model_config: Any, ids: list[list[int]]) -> None:
    """Log a warning for prompts longer than an unscaled model's ``max_position_embeddings`` (decoded as transformers
    does, without a word: the positions past it were never trained)."""
    limit = position_limit(model_config)
    long = [i for i, p in enumerate(ids) if limit is not None and len(p) > limit]
    if long:
        log.warning(
            "%d prompt(s) (first: prompt %d, %d tokens) are longer than the model's max_position_embeddings=%d and it "
            "scales no RoPE: positions past it were never trained, expect degraded outputs",
            len(long), long[0], len(ids[long[0]]), limit,
        )


@torch.no_grad()
def generate(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: Sequence[str] | Sequence[Sequence[int]],
    policy: PolicyCache | Any = None,
    settings: DecodeSettings | None = None,
    script: Sequence[Sequence[int | None]] | None = None,
) -> list[SequenceOutput]:
    """Decode every prompt with ``policy`` (a fresh :class:`PolicyCache`, or a policy config; None = full KV).

    Prompts are strings (tokenised as is: apply the chat template first) or lists of token ids.
    ``script[i][t]``: the id the environment writes as response token ``t`` of prompt ``i`` (``None``:
    the model writes it); past the end of a script the model writes freely.
    """
    settings = settings or DecodeSettings()
    if isinstance(prompts, str):  # iterating it would decode each character as a prompt of its own
        raise ValueError("prompts is one string: pass a list of prompts (generate(model, tokenizer, [prompt]))")
    if policy is None:
        policy = {"policy": "full"}
    cache = policy if isinstance(policy, PolicyCache) else build_policy(policy, model.config, tokenizer)
    if cache.steps_done:
        raise ValueError("generate needs a fresh cache (build one per call with build_policy)")
    built, model_shape = (cache.num_layers, cache.q_heads, cache.kv_heads, cache.head_dim), attention_shape(model.config)
    if built != model_shape:  # more layers decoded and reported empty layers' rows; fewer were IndexErrors
        raise ValueError(
            f"the cache was built for another model: (layers, query heads, KV heads, head dim) = {built}, this model "
            f"has {model_shape}; build it from this model's config (build_policy(cfg, model.config, tokenizer))"
        )
    ids = [
        list(p) if not isinstance(p, str) else tokenizer(p, add_special_tokens=False).input_ids
        for p in prompts
    ]
    if not ids or any(len(p) == 0 for p in ids):
        raise ValueError("every prompt must have at least one token")
    _check_token_ids(model, ids, script)
    _warn_past_positions(model.config, ids)
    run = _Decode(model, tokenizer, cache, ids, settings, script)
    bar = tqdm(
        total=settings.max_new_tokens, desc=f"decode[{cache.policy_name}]", disable=not settings.progress
    )
    with _policy_attention(model), _attached(cache, model), bar:
        pending = run.prefill()
        while True:
            pending = run.account(pending)
            bar.update(1)
            left = run.drop_finished(pending)
            if left is None:
                break
            pending = run.step(*left)
            if settings.progress:
                bar.set_postfix(active=len(run.active), rows=int(cache.resident_rows().float().mean()))
    return run.finish()


__all__ = [
    "DecodeSettings",
    "ForcedInput",
    "SequenceOutput",
    "StepStats",
    "generate",
    "mean_rows",
    "sample_token",
    "sample_tokens",
]
