"""Schemas of the groups every entry point shares: model, logger, deepspeed, hydra launcher glue."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModelConfig:
    """conf/model/*.yaml. Mirrors :class:`zoomr.models.ModelSpec`."""

    name: str = "tiny-qwen2"
    arch: str = "qwen2"
    hf_id: str | None = None
    tiny: dict[str, Any] | None = None
    dtype: str = "float32"
    attn_implementation: str = "sdpa"
    trust_remote_code: bool = False
    vocab_size: int = 4096
    seed: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoggerConfig:
    """conf/logger/*.yaml. ``mode``: auto (online with WANDB_API_KEY, else offline) | online | offline | disabled."""

    name: str = "wandb"
    project: str = "zoomr"
    entity: str | None = None
    mode: str = "auto"
    group: str | None = None
    tags: list[str] = field(default_factory=list)


@dataclass
class DeepSpeedConfig:
    """conf/deepspeed/*.yaml: ``config`` is a DeepSpeed JSON config (null = no DeepSpeed)."""

    name: str = "none"
    config: dict[str, Any] | None = None


SCHEMAS = [
    ("model", "model", ModelConfig),
    ("logger", "logger", LoggerConfig),
    ("deepspeed", "deepspeed", DeepSpeedConfig),
]
