"""Schemas of the primary configs (conf/train.yaml, eval.yaml, data_prep.yaml, analysis.yaml).

Groups whose entries differ in shape (method, data, benchmark, pipeline) are typed ``Any`` here and
each entry carries its own schema (see the other modules of this package).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from zoomr.schemas.core import DeepSpeedConfig, LoggerConfig, ModelConfig


@dataclass
class _Common:
    model: ModelConfig = field(default_factory=ModelConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    method: Any = None
    seed: int = 1234
    run_name: str = MISSING
    run_dir: str = MISSING
    cache_dir: str = MISSING  # tiny models and tokenizers are built here once
    device: str = "auto"  # auto | cpu | cuda | cuda:N


@dataclass
class TrainConfig(_Common):
    data: Any = None
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    resume: str = "auto"  # auto (latest checkpoint in run_dir if any) | never | <checkpoint path>


@dataclass
class EvalConfig(_Common):
    data: Any = None  # unused: present so a method config may name its training default (AbridgeKV: testbed)
    benchmark: Any = None
    generation: Any = None
    grading: Any = None


@dataclass
class DataPrepConfig(_Common):
    pipeline: Any = None
    data: Any = None


@dataclass
class AnalysisConfig(_Common):
    task: Any = None


SCHEMAS = [
    ("", "train_schema", TrainConfig),
    ("", "eval_schema", EvalConfig),
    ("", "data_prep_schema", DataPrepConfig),
    ("", "analysis_schema", AnalysisConfig),
]
