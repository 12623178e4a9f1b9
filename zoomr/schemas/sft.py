"""Schemas of supervised fine-tuning (``+method=sft``) and of reasoning-trace data (``data=traces``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from zoomr.schemas.checks import AT_LEAST_ONE, BETA, FRACTION, NON_NEGATIVE, POSITIVE, check_fields


@dataclass
class LoraSettings:
    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )

    def __post_init__(self) -> None:
        check_fields(self, "method.lora", r=AT_LEAST_ONE, alpha=POSITIVE, dropout=BETA)


@dataclass
class SFTMethod:
    """TRL SFTTrainer recipe: full fine-tuning or LoRA (``use_lora``), assistant-only loss."""

    name: str = "sft"
    trainer: str = "sft"  # module train.<trainer> runs this method
    use_lora: bool = True
    lora: LoraSettings = field(default_factory=LoraSettings)
    max_length: int = 1024  # TRL truncates silently at its default: always explicit
    max_steps: int = 30  # -1: use epochs
    epochs: float = 1.0
    per_device_batch_size: int = 2
    gradient_accumulation_steps: int = 1
    learning_rate: float = 2e-4
    weight_decay: float = 0.0
    warmup_ratio: float = 0.03
    lr_scheduler: str = "cosine"
    max_grad_norm: float = 1.0
    logging_steps: int = 5
    save_steps: int = 15
    save_total_limit: int = 2
    bf16: bool = False
    gradient_checkpointing: bool = False
    assistant_only_loss: bool = True

    def __post_init__(self) -> None:
        check_length(type(self).__name__, self.max_steps, self.epochs)
        check_fields(self, "method", max_length=AT_LEAST_ONE, per_device_batch_size=AT_LEAST_ONE,
                     gradient_accumulation_steps=AT_LEAST_ONE, learning_rate=POSITIVE, weight_decay=NON_NEGATIVE,
                     warmup_ratio=FRACTION, max_grad_norm=POSITIVE, logging_steps=AT_LEAST_ONE,
                     save_steps=AT_LEAST_ONE, save_total_limit=AT_LEAST_ONE)  # fmt: skip


def check_length(schema: str, max_steps: int, epochs: float | None = None) -> None:
    """Refuse a run that would train nothing (``max_steps=0`` makes the HF Trainer run one NaN-loss step)."""
    if epochs is not None and max_steps == -1:
        if not epochs > 0:
            raise ValueError(f"{schema}: max_steps=-1 trains method.epochs={epochs} epochs: give epochs > 0")
    elif max_steps < 1:
        also = " (or -1 to train method.epochs epochs)" if epochs is not None else ""
        raise ValueError(f"{schema}: max_steps={max_steps} trains nothing: give max_steps >= 1{also}")


@dataclass
class TracesData:
    """Reasoning traces in the Bespoke-Stratos / Sky-T1 tag format.

    ``source``: ``local`` (a JSONL/parquet file) or ``hub`` (``hub_id``, e.g. bespokelabs/Bespoke-Stratos-17k).
    ``format``: ``skythought_eval`` (rows with ``question`` and ``code[0]``, the vendored sample) or
    ``bespoke`` (rows with ``system`` and ``conversations`` [{from, value}]).
    """

    name: str = "traces"
    loader: str = "data_prep.traces"  # module with sft_dataset(data: dict, tokenizer) -> datasets.Dataset
    source: str = "local"
    path: str | None = None
    hub_id: str | None = None
    split: str = "train"
    format: str = "skythought_eval"
    max_samples: int | None = None
    # held out from training (a seeded random split): the held-out loss is evaluated at every save and at the
    # end (summary ``eval_loss``); 0 = train on every row
    eval_fraction: float = 0.0

    def __post_init__(self) -> None:
        if self.source not in ("local", "hub"):
            raise ValueError(f"data.source must be local or hub, got {self.source!r}")
        if self.format not in ("bespoke", "skythought_eval"):
            raise ValueError(f"data.format must be one of ['bespoke', 'skythought_eval'], got {self.format!r}")
        check_fields(self, "data", max_samples=AT_LEAST_ONE)
        if not 0 <= self.eval_fraction < 1:
            raise ValueError(f"data.eval_fraction={self.eval_fraction} (must be in [0, 1): a fraction of the rows)")


SCHEMAS = [("method", "sft", SFTMethod), ("data", "traces", TracesData)]
