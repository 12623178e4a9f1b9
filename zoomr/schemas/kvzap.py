"""Schemas of KVzap (papers/kvzap_*.txt): the training-pair pipeline and the surrogate fit (the pruning policy's
config, which holds the fit, lives with the policy in :mod:`zoomr.cache.kvzap`)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TextSource:
    """One pretraining-style subset. ``format``: ``jsonl`` (``fields`` joined by ``joiner``) or ``lines``."""

    name: str = "web"
    path: str = "data_prep/data/pretraining_text/c4_demo.jsonl"
    format: str = "jsonl"
    fields: list[str] = field(default_factory=lambda: ["text"])
    joiner: str = "\n"


@dataclass
class KVzapPairsPipeline:
    """``python -m data_prep +pipeline=kvzap_pairs``: (h, log s⁺) pairs per layer (paper §4.1).

    Documents are cut to ``min_tokens``-``max_tokens`` tokens (long documents into consecutive pieces,
    short ones packed), at most ``max_docs_per_subset`` training and ``val_docs_per_subset`` held-out
    documents per subset (held-out ones from different source documents), ``tokens_per_doc`` tokens
    sampled per document.
    """

    name: str = "kvzap_pairs"
    module: str = "kvzap_pairs"  # data_prep.<module>.run(cfg)
    sources: list[TextSource] = field(default_factory=list)
    out_dir: str = "runs/kvzap/pairs"
    min_tokens: int = 750
    max_tokens: int = 1250
    max_docs_per_subset: int = 500
    val_docs_per_subset: int = 5
    tokens_per_doc: int = 500
    chunk_size: int = 1024  # tokens per forward when scoring (memory: H x chunk x T attention weights)
    docs_per_shard: int = 64
    store_dtype: str = "bfloat16"  # hidden states on disk (targets are float32)
    instruction: str = "\n\nRepeat the previous context exactly."
    overwrite: bool = False  # a different plan in out_dir is an error unless true


@dataclass
class KVzapFit:
    """Surrogate fitting (paper §4.1): ridge linear and MLP D_h → D_h/8 → GELU → H_kv."""

    models: list[str] = field(default_factory=lambda: ["linear", "mlp"])
    target: str = "kvzip_plus"  # kvzip_plus | kvzip
    ridge_alpha: float = 1.0
    hidden_dim: int | None = None  # None: D_h // 8
    epochs: int = 15
    batch_size: int = 512
    lr: float = 5.0e-3
    weight_decay: float = 0.01
    clip: float = 1.0
    max_train_pairs: int | None = None  # subsample the training pairs (None: all)


SCHEMAS = [("pipeline", "kvzap_pairs", KVzapPairsPipeline)]
