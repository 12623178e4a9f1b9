"""``abridge.json`` next to a trained checkpoint: the layout and quotas it was trained with.

Allocation, serving and evaluation read it, so a checkpoint is never run with a layout it was not
trained for.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from zoomr.abridge.layout import AbridgeLayout
from zoomr.abridge.quotas import is_int_list
from zoomr.jsonl import BadRowError, read_json_object
from zoomr.paths import MissingInput, resolve_repo_path
from zoomr.rundir import write_json

FILENAME = "abridge.json"


def save_abridge_config(directory: str | Path, layout: AbridgeLayout, quotas: list[int], **info: Any) -> Path:
    p = Path(directory) / FILENAME
    write_json(p, {"layout": asdict(layout), "quotas": list(quotas), **info})
    return p


def load_abridge_config(directory: str | Path) -> tuple[AbridgeLayout, list[int], dict[str, Any]]:
    """(layout, quotas, other info) of a checkpoint trained by ``+method=abridge``."""
    d = resolve_repo_path(directory)
    p = d / FILENAME
    if not p.exists():
        raise MissingInput(
            f"{p} not found: {directory} is not an AbridgeKV checkpoint (train one with `python -m train +method=abridge`)"
        )
    data = read_json_object(p, "AbridgeKV layout")
    try:
        layout = AbridgeLayout(**data.pop("layout"))
        quotas = data.pop("quotas")
        if not is_int_list(quotas):
            raise ValueError(f"quotas must be a list of integers, got {quotas!r}")
    except (KeyError, TypeError, ValueError) as e:
        raise BadRowError(
            f"{p}: not the record +method=abridge writes ({type(e).__name__}: {e}); expected "
            '{"layout": {"block_size": int, "num_pause": int, "code_positions": str}, "quotas": [int, ...], ...}'
        ) from None
    return layout, quotas, data
