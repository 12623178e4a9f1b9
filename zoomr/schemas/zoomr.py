"""Schemas of ZoomR: summary augmentation (``+pipeline=summarize``), delimiter SFT (``+method=zoomr_sft``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from zoomr import tokens
from zoomr.schemas.cache import PolicyConfig
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
    - ``offload``: the full KV lives in (pinned) host memory and only I_f is brought to the device,
      layer by layer (``prefetch``: the next layer's rows are copied on a side stream, CUDA only).
    """

    name: str = "zoomr"
    policy: str = "zoomr"
    top_k: int = 2
    consensus: int = 2
    window: int = 512
    summaries: str = "voted"
    zoom_keeps_summary: bool = False
    recompute: str = "boundary"
    mean_key_delimiters: bool = False
    offload: bool = True
    prefetch: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.top_k < 1 or self.consensus < 0 or self.window < 0:
            raise ValueError(
                f"ZoomRConfig: need top_k >= 1, consensus >= 0, window >= 0; got "
                f"{self.top_k}, {self.consensus}, {self.window}"
            )
        if self.summaries not in ("voted", "all"):
            raise ValueError(f"ZoomRConfig: summaries must be voted|all, got {self.summaries!r}")
        if self.recompute not in ("boundary", "every"):
            raise ValueError(f"ZoomRConfig: recompute must be boundary|every, got {self.recompute!r}")


SCHEMAS = [
    ("pipeline", "summarize", SummarizePipeline),
    ("method", "zoomr_sft", ZoomRSFTMethod),
    ("method", "zoomr", ZoomRConfig),
]
