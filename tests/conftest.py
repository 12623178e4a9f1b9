"""Shared test setup: offline, single-threaded, W&B disabled, tiny models from the shared cache."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["WANDB_MODE"] = "disabled"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

from zoomr.models import tiny_spec  # noqa: E402,F401  (re-exported for the tests)

TINY_ARCHS = ("qwen2", "llama", "qwen3")


@pytest.fixture(scope="session")
def cache_dir() -> str:
    from zoomr.models import default_cache_dir

    return str(default_cache_dir())


@pytest.fixture(scope="session", params=TINY_ARCHS)
def tiny_arch(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def tiny_model_and_tokenizer(cache_dir):
    """fp32 tiny qwen2 (the default) with the local tokenizer, loaded via from_pretrained."""
    from zoomr.models import load_model_and_tokenizer

    return load_model_and_tokenizer(tiny_spec("qwen2"), cache_dir)
