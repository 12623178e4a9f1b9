"""Schemas of KVzap (papers/kvzap_*.txt): the training-pair pipeline and the surrogate fit (the pruning policy's
config, which holds the fit, lives with the policy in :mod:`zoomr.cache.kvzap`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zoomr.schemas.checks import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, check_fields


@dataclass
class TextSource:
    """One pretraining-style subset. ``format``: ``jsonl`` (``fields`` joined by ``joiner``) or ``lines``."""

    name: str = "web"
    path: str = "data_prep/data/pretraining_text/c4_demo.jsonl"
    format: str = "jsonl"
    fields: list[str] = field(default_factory=lambda: ["text"])
    joiner: str = "\n"

    def __post_init__(self) -> None:
        if self.format not in ("jsonl", "lines"):
            raise ValueError(f"pipeline.sources[{self.name}].format must be jsonl|lines, got {self.format!r}")
        if self.format == "jsonl" and not self.fields:
            raise ValueError(f"pipeline.sources[{self.name}]: a jsonl source needs fields (the keys joined into a text)")


@dataclass
class TestbedPairsSource:
    """Recall-testbed traces as KVzap documents (``+pipeline=kvzap_pairs_testbed``; data_prep/kvzap_pairs_testbed.py).

    Problem ``i`` of the testbed stream ``seed`` (its own generator, as the evaluator's test problems are
    of ``test_seed``): problems ``0..n_val-1`` are held out, ``n_val..n_val+n_train-1`` train. ``data``
    overrides :class:`zoomr.schemas.testbed.TestbedData` fields (trace format); a model directory's
    ``testbed_data.json`` must agree on the format, and ``seed`` must differ from its training and test
    seeds and from ``exclude_seeds`` (the evaluator's test seeds).

    Pretext (``pretext``): ``recall`` (default) appends one cue query ``? k : = v`` per fact the trace
    defined (shuffled with the seed), continuing the trace's final ``\\boxed{}`` list, and scores the
    context by the attention of those query tokens: the context's bindings reconstructed through the task
    the model knows. The testbed vocabulary has none of the repeat instruction's words, and the trained
    base model does not copy a repeated trace (measured: 5% next-token accuracy), so KVzip's literal
    repeat would not be a reconstruction. ``copy`` is the literal repeat (the context right after itself,
    the layout of the model's copy warm-up), kept as a variant.
    """

    __test__ = False  # not a pytest class despite the name

    seed: int = 2  # a training stream: 3,000,017 is a held-out test seed (analysis/results/testbed_cue_3layer)
    n_train: int = 256
    n_val: int = 16
    pretext: str = "recall"  # recall | copy
    exclude_seeds: list[int] = field(default_factory=lambda: [1_000_003, 2_000_003, 3_000_017])
    data: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.pretext not in ("recall", "copy"):
            raise ValueError(f"pipeline.testbed.pretext must be recall|copy, got {self.pretext!r}")
        if self.n_train < 1 or self.n_val < 1:
            raise ValueError(f"pipeline.testbed needs n_train, n_val >= 1, got {self.n_train}, {self.n_val}")
        if self.seed in self.exclude_seeds:
            raise ValueError(
                f"pipeline.testbed.seed={self.seed} is one of the test seeds {self.exclude_seeds}: "
                "pairs must come from a stream disjoint from the evaluation problems"
            )


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
    testbed: TestbedPairsSource | None = None  # set: documents are testbed traces, ``sources`` unused

    def __post_init__(self) -> None:
        check_fields(self, "pipeline", min_tokens=AT_LEAST_ONE, max_tokens=AT_LEAST_ONE,
                     max_docs_per_subset=AT_LEAST_ONE, val_docs_per_subset=AT_LEAST_ONE, tokens_per_doc=AT_LEAST_ONE,
                     chunk_size=AT_LEAST_ONE, docs_per_shard=AT_LEAST_ONE)  # fmt: skip
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"pipeline: min_tokens={self.min_tokens} > max_tokens={self.max_tokens}")
        if self.store_dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"pipeline.store_dtype must be float32|bfloat16|float16, got {self.store_dtype!r}")


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

    def __post_init__(self) -> None:
        check_fields(self, "method.fit", ridge_alpha=NON_NEGATIVE, hidden_dim=AT_LEAST_ONE, epochs=AT_LEAST_ONE,
                     batch_size=AT_LEAST_ONE, lr=POSITIVE, weight_decay=NON_NEGATIVE, clip=POSITIVE,
                     max_train_pairs=AT_LEAST_ONE)  # fmt: skip
        unknown = sorted(set(self.models) - {"linear", "mlp"})
        if unknown or not self.models:
            raise ValueError(f"method.fit.models={self.models!r}: give one or both of linear, mlp")
        if self.target not in ("kvzip_plus", "kvzip"):
            raise ValueError(f"method.fit.target must be kvzip_plus|kvzip, got {self.target!r}")


SCHEMAS = [("pipeline", "kvzap_pairs", KVzapPairsPipeline)]
