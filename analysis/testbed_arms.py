"""Running cache-policy arms on the recall testbed: load a trained model, decode its test problems through
the project's engine with the environment's script, grade them exactly.

Shared by :mod:`analysis.testbed_table` (full KV vs eviction baselines) and :mod:`analysis.zoomr_testbed`.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from zoomr import tokens

DATA_FILE = "testbed_data.json"  # the TestbedData a checkpoint was trained on (written by the trainer)


def load_testbed_model(path: str | Path, attn_implementation: str | None = None):
    """(model in eval mode, tokenizer) of a checkpoint saved by ``+method=sft_testbed``."""
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs)
    return model.eval(), PreTrainedTokenizerFast.from_pretrained(path)


def trained_data(path: str | Path, **overrides: Any):
    """The checkpoint's training data config (summaries or not, …) with ``overrides`` (None values ignored)."""
    from zoomr.abridge.trainer import DATA_CONFIG_FILE
    from zoomr.schemas.testbed import TestbedData

    # a base model's testbed_data.json, else the data.json of a fine-tune (AbridgeKV, LightThinker)
    file = next((Path(path) / f for f in (DATA_FILE, DATA_CONFIG_FILE) if (Path(path) / f).exists()), None)
    base = json.loads(file.read_text()) if file else {}
    if base and "query_form" not in base:  # trained before issue 13: the "? k v" format
        base["query_form"] = "inline"
    return TestbedData(**{**base, **{k: v for k, v in overrides.items() if v is not None}})


def test_records(data, n: int) -> list[dict[str, Any]]:
    from data_prep.testbed_grading import load_test_problems

    return load_test_problems(data, n)


def full_rows(records: list[dict[str, Any]]) -> float:
    """Mean rows full KV holds at the end of a problem (prompt with chat markup + response + end of turn)."""
    from data_prep import testbed_tokenizer as tt

    enc = tt.FastEncoder()
    return float(np.mean([len(enc.prompt(r["prompt"].split())) + r["response_tokens"] + 1 for r in records]))


def run_arm(model, tokenizer, records: list[dict[str, Any]], policy: dict[str, Any], batch: int = 64):
    """Decode every record greedily with ``policy`` (a fresh cache per batch); returns (outputs, grades, caches)."""
    from tqdm.auto import tqdm

    from data_prep import testbed_tokenizer as tt
    from data_prep.testbed_grading import grade, script_ids
    from zoomr.cache import build_policy
    from zoomr.engine import DecodeSettings, generate

    enc = tt.FastEncoder(tokenizer)
    stop = [tokenizer.convert_tokens_to_ids(tokens.IM_END)]
    outs, caches = [], []
    for i in tqdm(range(0, len(records), batch), desc=f"testbed[{policy_dict(policy).get('policy')}]", unit="batch"):
        chunk = records[i : i + batch]
        scripts = [script_ids(r, tokenizer) for r in chunk]
        settings = DecodeSettings(
            max_new_tokens=max(map(len, scripts)) + 8, temperature=0.0, stop_token_ids=stop, progress=False
        )
        cache = build_policy(policy, model.config, tokenizer)
        outs += generate(model, tokenizer, [enc.prompt(r["prompt"].split()) for r in chunk], cache, settings, scripts)
        caches.append(cache)
    return outs, [grade(r, o.text) for r, o in zip(records, outs)], caches


def policy_dict(cfg: Any) -> dict[str, Any]:
    return cfg if isinstance(cfg, dict) else asdict(cfg)
