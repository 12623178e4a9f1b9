"""Argument checks shared by the analysis scripts' command lines (refused before any model loads or file is written)."""

from __future__ import annotations

import argparse
from pathlib import Path


def require_at_least(parser: argparse.ArgumentParser, args: argparse.Namespace, low: int, *names: str) -> None:
    """``parser.error`` naming every option among ``names`` (dests; lists: any element) below ``low``; None passes."""
    bad = []
    for name in names:
        value = getattr(args, name)
        values = value if isinstance(value, list) else [value]
        if any(v is not None and v < low for v in values):
            bad.append("--" + name.replace("_", "-"))
    if bad:
        parser.error(f"{', '.join(bad)} must be >= {low}")


def require_checkpoint(parser: argparse.ArgumentParser, path: str, option: str = "--model") -> None:
    """``parser.error`` unless ``path`` is a saved model directory (a ``config.json`` in it)."""
    if not (Path(path) / "config.json").is_file():
        parser.error(f"{option} {path}: not a checkpoint directory (no config.json)")
