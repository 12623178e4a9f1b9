"""Tiny models with their own tokenizer: ``extra: {tokenizer: "<module>:<function>"}`` in a model config.

The function takes no arguments and returns a ``PreTrainedTokenizerFast`` (e.g. the recall testbed's
word-level tokenizer, :func:`zoomr.testbed.vocab.build_tokenizer`). It is built once into
``<cache>/tokenizers/<module TOKENIZER_VERSION>-<hash>`` and loaded from there like the default BPE.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from pathlib import Path
from typing import Any


def tokenizer_builder(extra: dict[str, Any]) -> str | None:
    """The builder a model config names, or None for the default local BPE."""
    builder = (extra or {}).get("tokenizer")
    if builder is not None and (not isinstance(builder, str) or ":" not in builder):
        raise ValueError(f"model.extra.tokenizer must be '<module>:<function>', got {builder!r}")
    return builder


def builder_version(builder: str) -> str:
    module = importlib.import_module(builder.partition(":")[0])
    return f"{builder}@{getattr(module, 'TOKENIZER_VERSION', 'unversioned')}"


def named_tokenizer_dir(builder: str, cache_dir: Path) -> Path:
    """Build (once) and save the tokenizer ``builder`` returns; return its directory."""
    module_name, _, fn_name = builder.partition(":")
    module = importlib.import_module(module_name)
    fn = getattr(module, fn_name, None)
    if fn is None:
        raise ValueError(f"model.extra.tokenizer: {module_name} has no function {fn_name!r}")
    version = builder_version(builder)
    path = Path(cache_dir) / "tokenizers" / f"{version.rpartition('@')[2]}-{hashlib.sha256(version.encode()).hexdigest()[:8]}"
    if not (path / "tokenizer.json").exists():
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        fn().save_pretrained(tmp)
        if not path.exists():
            tmp.rename(path)
    return path
