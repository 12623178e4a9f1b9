"""End-of-run summary shared by every trainer: printed table + summary.json in the run directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def loss_curve(log_history: list[dict[str, Any]], key: str = "loss") -> list[tuple[int, float]]:
    return [(int(h["step"]), float(h[key])) for h in log_history if key in h and "step" in h]


def write_summary(run_dir: Path, summary: dict[str, Any], title: str) -> str:
    """Write ``summary.json`` and return a readable block (also printed by the caller)."""
    (Path(run_dir) / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    width = max(len(k) for k in summary)
    lines = [f"== {title} ==", *(f"{k:<{width}}  {_fmt(v)}" for k, v in summary.items())]
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
