"""Schemas of the KV-cache policies (``conf/method/<policy>.yaml``): one dataclass per policy.

Common fields: ``policy`` (registry name in ``zoomr.cache``), ``page_size`` (rows per storage page),
``budget_rows`` (rows per (layer, sequence, KV head) resident between decode steps; ``None`` = unbounded).
A budget relative to the run (``python -m eval`` resolves it into ``budget_rows`` before decoding, see
``eval/budget.py``): ``budget_fraction`` f = f x the rows full KV holds at the end of a sequence (its mean
peak resident rows, read from the full-KV run ``budget_reference``, default the same benchmark and model's
``…/full`` run), or ``budget_match`` = a run directory whose mean resident rows the budget takes. In Python,
``zoomr.cache.match_budget(cfg, rows)`` does the same with a number.
"""

from __future__ import annotations

from dataclasses import dataclass


def _positive(cls_name: str, **values: int | float | None) -> None:
    for key, value in values.items():
        if value is not None and value <= 0:
            raise ValueError(f"{cls_name}: {key} must be > 0, got {value}")


def _ratio(cls_name: str, ratio: float, budget_rows: int | None) -> None:
    """A prompt compression ratio (kvpress's ``compression_ratio``) replaces the fixed budget."""
    if not 0.0 <= ratio < 1.0:
        raise ValueError(f"{cls_name}: compression_ratio must be in [0, 1), got {ratio}")
    if budget_rows is not None:
        raise ValueError(
            f"{cls_name}: compression_ratio={ratio} replaces budget_rows={budget_rows}: set method.budget_rows=null"
        )


@dataclass
class PolicyConfig:
    """Fields every cache policy has."""

    name: str = "full"
    policy: str = "full"
    trainer: str | None = None  # cache policies are inference-time methods: nothing to train
    page_size: int = 16
    budget_rows: int | None = None
    budget_fraction: float | None = None  # of full KV's rows (resolved into budget_rows by python -m eval)
    budget_reference: str | None = None  # the full-KV run directory for budget_fraction (None: …/full)
    budget_match: str | None = None  # a run directory: budget_rows = its mean resident rows

    def __post_init__(self) -> None:
        name = type(self).__name__
        _positive(name, page_size=self.page_size, budget_rows=self.budget_rows)
        if self.budget_fraction is not None and not 0 < self.budget_fraction <= 1:
            raise ValueError(f"{name}: budget_fraction must lie in (0, 1], got {self.budget_fraction}")
        if self.budget_fraction is not None and self.budget_match is not None:
            raise ValueError(f"{name}: set budget_fraction or budget_match, not both")
        if self.budget_reference is not None and self.budget_fraction is None:
            raise ValueError(f"{name}: budget_reference is the full-KV run of budget_fraction; set budget_fraction")

    @property
    def budget_pending(self) -> bool:
        """A relative budget (fraction / match) not yet turned into ``budget_rows``."""
        return self.budget_fraction is not None or self.budget_match is not None


@dataclass
class FullConfig(PolicyConfig):
    """Full KV cache on the device (the reference every other policy is measured against)."""


@dataclass
class OffloadConfig(PolicyConfig):
    """Full KV cache held on host memory; only the current layer's rows are brought to the device."""

    name: str = "offload"
    policy: str = "offload"
    prefetch: bool = True  # copy layer l+1's rows on a side stream while layer l computes (CUDA only)


@dataclass
class StreamingConfig(PolicyConfig):
    """StreamingLLM (Xiao et al. 2024): the first ``n_sink`` rows + the most recent ``budget_rows - n_sink``.

    ``reposition``: re-rotate kept keys to their positions inside the cache (the paper's pos_shift variant);
    default keeps original positions (as R-KV's baseline does).
    """

    name: str = "streaming"
    policy: str = "streaming"
    budget_rows: int | None = 1024
    n_sink: int = 4
    reposition: bool = False
    compression_ratio: float | None = None  # variant: prune each prompt once to this ratio (budget_rows=None)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.compression_ratio is not None:
            _ratio("StreamingConfig", self.compression_ratio, self.budget_rows)
            if self.n_sink < 0:
                raise ValueError(f"StreamingConfig: need n_sink >= 0, got {self.n_sink}")
            return
        if self.budget_rows is None or self.n_sink < 0 or self.budget_rows <= self.n_sink:
            raise ValueError(
                f"StreamingConfig: need budget_rows > n_sink >= 0, got {self.budget_rows}, {self.n_sink}"
            )


@dataclass
class H2OConfig(PolicyConfig):
    """H2O (Zhang et al. 2023): top ``budget_rows - recent_rows`` rows by accumulated attention + recent rows.

    ``recent_rows`` defaults to half the budget (the paper's equal heavy/recent split).
    """

    name: str = "h2o"
    policy: str = "h2o"
    budget_rows: int | None = 1024
    recent_rows: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.budget_rows is None:
            raise ValueError("H2OConfig: budget_rows is required")
        if self.recent_rows is not None and not 0 <= self.recent_rows <= self.budget_rows:
            raise ValueError(f"H2OConfig: need 0 <= recent_rows <= budget_rows, got {self.recent_rows}")

    @property
    def recent(self) -> int:
        return self.budget_rows // 2 if self.recent_rows is None else self.recent_rows


@dataclass
class SnapKVConfig(PolicyConfig):
    """SnapKV (Li et al. 2024), prefill only: the last ``window`` prompt queries vote (attention summed over the
    window, averaged over a GQA group, pooled with ``kernel``); keep the top ``budget_rows - window`` + window."""

    name: str = "snapkv"
    policy: str = "snapkv"
    budget_rows: int | None = 1024
    window: int = 32
    kernel: int = 5
    pooling: str = "avgpool"
    compression_ratio: float | None = None  # each prompt keeps int(n * (1 - ratio)) rows (budget_rows=None)

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("SnapKVConfig", window=self.window, kernel=self.kernel)
        if self.compression_ratio is not None:
            _ratio("SnapKVConfig", self.compression_ratio, self.budget_rows)
        elif self.budget_rows is None or self.budget_rows < self.window:
            raise ValueError(
                f"SnapKVConfig: need budget_rows >= window, got {self.budget_rows} < {self.window}"
            )
        if self.kernel % 2 == 0:
            raise ValueError(f"SnapKVConfig: kernel must be odd (centred pooling), got {self.kernel}")
        if self.pooling not in ("avgpool", "maxpool"):
            raise ValueError(f"SnapKVConfig: pooling must be avgpool or maxpool, got {self.pooling!r}")


@dataclass
class RKVConfig(PolicyConfig):
    """R-KV (Cai et al. 2025): score = lam * importance - (1 - lam) * redundancy, per KV head.

    ``window`` most recent queries score the non-window keys (GQA: max over the group's logits), max-pooled
    with ``kernel``; redundancy from key cosine similarity (> ``similarity_threshold``: near-duplicate).
    Compaction to ``budget_rows`` when the rows exceed ``budget_rows + buffer``.
    """

    name: str = "rkv"
    policy: str = "rkv"
    budget_rows: int | None = 1024
    window: int = 8
    kernel: int = 7
    lam: float = 0.1
    similarity_threshold: float = 0.5
    buffer: int = 128

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive(type(self).__name__, window=self.window, kernel=self.kernel)
        if self.buffer < 0:
            raise ValueError(f"{type(self).__name__}: buffer must be >= 0, got {self.buffer}")
        if self.budget_rows is None or self.budget_rows <= self.window:
            raise ValueError(f"{type(self).__name__}: need budget_rows > window, got {self.budget_rows}")
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"{type(self).__name__}: lam must lie in [0, 1], got {self.lam}")
        if not -1.0 <= self.similarity_threshold <= 1.0:  # a cosine similarity (1: no row is exempted)
            raise ValueError(
                f"{type(self).__name__}: similarity_threshold is a cosine similarity and must lie in [-1, 1], "
                f"got {self.similarity_threshold}"
            )
        if self.kernel % 2 == 0:
            raise ValueError(f"{type(self).__name__}: kernel must be odd, got {self.kernel}")


@dataclass
class RKVServingConfig(RKVConfig):
    """R-KV serving variant (AbridgeKV's comparison): one kept set shared by every head and layer, scores
    averaged over heads and summed over layers, compaction every ``compact_every`` decode steps."""

    name: str = "rkv_serving"
    policy: str = "rkv_serving"
    compact_every: int = 64

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("RKVServingConfig", compact_every=self.compact_every)


@dataclass
class BlockEvictConfig(PolicyConfig):
    """AbridgeKV's eviction ablation: of each completed ``block`` of generated rows keep ``keep`` rows, chosen by
    ``rule``: ``recency`` (the block's last rows), ``random`` (uniform, ``seed``) or ``attention`` (accumulated
    attention received, H2O-style, summed over the GQA group). The prompt and the open block stay whole."""

    name: str = "evict_recency"
    policy: str = "evict_block"
    block: int = 512
    keep: int = 128
    rule: str = "recency"
    seed: int = 1234

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("BlockEvictConfig", block=self.block, keep=self.keep)
        if self.keep > self.block:
            raise ValueError(f"BlockEvictConfig: keep ({self.keep}) > block ({self.block})")
        if self.rule not in ("recency", "random", "attention"):
            raise ValueError(f"BlockEvictConfig: rule must be recency|random|attention, got {self.rule!r}")


SCHEMAS = [
    ("method", "full", FullConfig),
    ("method", "offload", OffloadConfig),
    ("method", "streaming", StreamingConfig),
    ("method", "h2o", H2OConfig),
    ("method", "snapkv", SnapKVConfig),
    ("method", "rkv", RKVConfig),
    ("method", "rkv_serving", RKVServingConfig),
    ("method", "evict_block", BlockEvictConfig),
]
