"""Schemas of ZoomR: summary augmentation (``+pipeline=summarize``), delimiter SFT (``+method=zoomr_sft``).

The decoding policy's config (``+method=zoomr`` / ``sumr``) lives with the policy in :mod:`zoomr.cache.zoomr`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zoomr import tokens
from zoomr.schemas.checks import AT_LEAST_ONE, NON_NEGATIVE, check_fields
from zoomr.schemas.endpoint import EndpointSettings
from zoomr.schemas.sft import SFTMethod


@dataclass
class SummarizePipeline:
    """``conf/pipeline/summarize.yaml``: paragraph summaries from an OpenAI-compatible server (ZoomR A.1).

    The API key is never part of the config: ``endpoint.api_key_env`` names the environment variable.
    ``store`` (default ``<out_dir>/store.sqlite``) caches every finished summary keyed by
    (paragraph hash, model, prompt version): rerunning asks only for what is missing.
    """

    name: str = "summarize"
    module: str = "summarize"  # data_prep.<module>.run(cfg)
    endpoint: EndpointSettings = field(default_factory=EndpointSettings)
    min_paragraph_chars: int = 400
    keep_truncated: bool = False
    reject_truncated_answers: bool = True
    out_dir: str = "runs/data_prep/summaries"
    store: str | None = None
    max_rows: int | None = None
    count_tokens: bool = True  # report lengths in tokens of the config's model tokenizer
    progress: bool = True

    def __post_init__(self) -> None:
        check_fields(self, "pipeline", min_paragraph_chars=NON_NEGATIVE, max_rows=AT_LEAST_ONE)


@dataclass
class ZoomRSFTMethod(SFTMethod):
    """``+method=zoomr_sft``: LoRA SFT on summary-augmented traces (ZoomR §3.2, §4: 16K max length).

    ``trainable_tokens`` are added to the tokenizer when missing (embeddings resized) and their input
    embedding and output-head rows are trained next to LoRA (PEFT ``trainable_token_indices``):
    LoRA on the linear layers alone cannot learn a new token's embedding.
    """

    name: str = "zoomr_sft"
    trainer: str = "zoomr_sft"
    max_length: int = 16384
    trainable_tokens: list[str] = field(default_factory=lambda: list(tokens.SUMMARY_TAGS))
    require_summaries: bool = True  # refuse data without any <|begin_of_summary|>


SCHEMAS = [
    ("pipeline", "summarize", SummarizePipeline),
    ("method", "zoomr_sft", ZoomRSFTMethod),
]
