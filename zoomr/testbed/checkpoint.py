"""A trained testbed checkpoint: the model, its tokenizer and the data config it learned.

``+method=sft_testbed`` saves ``<run>/final`` with ``save_pretrained`` and writes :data:`DATA_FILE` beside
it, so the evaluation scripts test a model on its own distribution (summaries or not, trace length, query
form): :func:`finalize` writes it, :func:`trained_data` reads it. Arms run through the evaluator (:func:`eval.testbed_task.testbed_arm`).
"""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zoomr import tokens
from zoomr.jsonl import BadRowError, read_json_object
from zoomr.rundir import write_json
from zoomr.schemas.testbed import TestbedData

DATA_FILE = "testbed_data.json"  # the TestbedData a checkpoint was trained on (written by the trainer)
# the data config a block-masked fine-tune (AbridgeKV, LightThinker) was trained on, written beside its weights by
# zoomr.abridge.trainer.save_final (evaluators test it on its own task). Defined here, not there: reading it from
# the trainer's module imported transformers' Trainer into every evaluation of a testbed checkpoint (seconds of
# start-up, and its W&B integration's "[INFO] Running in WANDB offline mode" under WANDB_MODE=offline)
DATA_CONFIG_FILE = "data.json"


def load_testbed_model(path: str | Path, attn_implementation: str | None = None):
    """(model in eval mode, tokenizer) of a checkpoint saved by ``+method=sft_testbed``."""
    from transformers import PreTrainedTokenizerFast

    from zoomr.models import (
        ModelPathError,
        checkpoint_dir_problem,
        load_matching_weights,
        tokenizer_vocab_problem,
    )

    if problem := checkpoint_dir_problem(path):  # never sent to the hub as a repo id
        raise ModelPathError(f"testbed checkpoint {path}: {problem}")
    if not (Path(path) / "tokenizer.json").is_file():  # transformers: "You need to have sentencepiece or tiktoken …"
        raise ModelPathError(f"testbed checkpoint {path}: no tokenizer.json (the testbed's word-level tokenizer); save it "
                             "beside the weights (tokenizer.save_pretrained(<dir>))")  # fmt: skip
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model = load_matching_weights(path, dtype=torch.float32, **kwargs)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    if problem := tokenizer_vocab_problem(path, tokenizer):
        raise ModelPathError(f"testbed checkpoint {path}: {problem}")
    return model.eval(), tokenizer


def testbed_record(path: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """(file, record) of the testbed data ``path`` was trained on: a base model's ``testbed_data.json``, or the
    ``data.json`` of a fine-tune (AbridgeKV, LightThinker) whose data was the testbed; None when there is none
    (a hub model, or a fine-tune on other data, e.g. ``data=traces``)."""
    for name in (DATA_FILE, DATA_CONFIG_FILE):
        file = Path(path) / name
        if file.exists():
            record = read_json_object(file, "testbed data config")
            testbed = name == DATA_FILE or record.get("loader", TestbedData.loader) == TestbedData.loader
            return (file, record) if testbed else None
    return None


def trained_data(path: str | Path, **overrides: Any) -> TestbedData:
    """The checkpoint's training data config (summaries or not, …) with ``overrides`` (None values ignored)."""
    file, base = testbed_record(path) or (None, {})
    if base and "query_form" not in base:  # trained before issue 13: the "? k v" format
        base["query_form"] = "inline"
    try:
        recorded = TestbedData(**base)
    except (TypeError, ValueError) as e:
        raise BadRowError(f"{file}: not the testbed data config the trainer writes ({e})") from None
    return replace(recorded, **{k: v for k, v in overrides.items() if v is not None})


QUERY_FORMAT_FIELDS = ("query_form", "paragraph_topics")  # how a query reads: a model trained on one cannot read another


def format_differences(path: str | Path, data: TestbedData, fields: tuple[str, ...] = QUERY_FORMAT_FIELDS) -> dict[str, tuple[Any, Any]]:
    """``field -> (trained, given)`` for each of ``fields`` in which the traces of ``data`` differ from those the
    checkpoint at ``path`` was trained on; empty when they match or ``path`` holds no testbed data config."""
    if testbed_record(path) is None:
        return {}  # a hub model, a checkpoint from elsewhere or trained on other data: nothing to compare with
    trained = trained_data(path)
    return {f: (getattr(trained, f), getattr(data, f)) for f in fields if getattr(trained, f) != getattr(data, f)}


def training_streams(path: str | Path, max_depth: int = 16) -> dict[int, str]:
    """Testbed stream seed -> the checkpoint trained on it, for ``path`` and every checkpoint it was fine-tuned
    from (``method.init_from`` in each run directory's ``config.json``, followed back to a model trained from
    scratch). Problem ``i`` of a stream is the same problem wherever it is drawn, so a test seed in this map
    would test the model on problems it trained on. Empty for a checkpoint with no recorded testbed data."""
    from zoomr.rundir import started_from

    streams: dict[int, str] = {}
    seen: set[Path] = set()
    current: Path | None = Path(path)
    while current is not None and len(seen) < max_depth and current.resolve() not in seen:
        seen.add(current.resolve())
        if testbed_record(current) is not None:
            streams.setdefault(trained_data(current).seed, str(current))
        current = started_from(current)
    return streams


def full_rows(records: list[dict[str, Any]]) -> float:
    """Mean rows full KV holds at the end of a problem (prompt with chat markup + response + end of turn)."""
    from zoomr.testbed import vocab as tt

    enc = tt.FastEncoder()
    return float(np.mean([len(enc.prompt(r["prompt"].split())) + r["response_tokens"] + 1 for r in records]))


def finalize(model, tokenizer, data: TestbedData, out: Path) -> None:
    """Save for ``from_pretrained``, with the data config it learned (``testbed_data.json``: the evaluation
    scripts test a model on its own distribution); generation stops at ``<|im_end|>``."""
    im_end = tokenizer.convert_tokens_to_ids(tokens.IM_END)
    model.generation_config.eos_token_id = [im_end, tokenizer.eos_token_id]
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_json(out / DATA_FILE, asdict(data))
