"""Per-layer code-row quotas q_ℓ (AbridgeKV §3 "budget", §5.1 allocation).

A quota is how many of a block's K code rows layer ℓ keeps (the same for every KV head of the layer).
Uniform: q_ℓ = q everywhere (default K/2). Per-layer: measure, for each layer alone, the held-out CE
increase when its quota is halved; the costliest sixth of the layers get 2q, the cheapest third q/2,
the rest q, so the mean stays q (paper: 6·256 + 18·128 + 12·64 = 36·128).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zoomr.jsonl import BadRowError, read_json_object
from zoomr.paths import MissingInput, resolve_repo_path
from zoomr.rundir import write_json
from zoomr.schemas.checks import is_integer


def check_quotas(quotas: Sequence[int], num_layers: int, num_pause: int) -> list[int]:
    quotas = [int(q) for q in quotas]
    if len(quotas) != num_layers:
        raise ValueError(f"quota schedule has {len(quotas)} entries for a model with {num_layers} layers")
    bad = [(i, q) for i, q in enumerate(quotas) if not 0 <= q <= num_pause]
    if bad:
        raise ValueError(f"quotas must lie in [0, K={num_pause}]; bad (layer, quota): {bad}")
    return quotas


def load_schedule(path: str | Path) -> list[int]:
    """Quotas from a schedule file (JSON with a ``quotas`` list, as written by :func:`save_schedule`)."""
    p = resolve_repo_path(path)
    if not p.exists():
        raise MissingInput(f"quota schedule not found: {path} (looked at {p})")
    data = read_json_object(p, "quota schedule")
    if not is_int_list(data.get("quotas")):
        raise BadRowError(f"{p}: expected a JSON object with a 'quotas' list of integers, got {data.get('quotas')!r}")
    return data["quotas"]


def is_int_list(value: Any) -> bool:
    """A JSON list of integers (a float quota would be truncated, a bool taken as 0/1)."""
    return isinstance(value, list) and all(is_integer(q) for q in value)


def save_schedule(path: str | Path, quotas: Sequence[int], **info: Any) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_json(p, {"quotas": [int(q) for q in quotas], **info})
    return p


def resolve_quotas(num_layers: int, num_pause: int, quota: int | None, schedule: str | None) -> list[int]:
    """The schedule file when given, else ``quota`` (default K/2) on every layer."""
    if schedule:
        return check_quotas(load_schedule(schedule), num_layers, num_pause)
    q = num_pause // 2 if quota is None else quota
    return check_quotas([q] * num_layers, num_layers, num_pause)


def pause_positions_needed(schedule: Sequence[int], num_pause: int) -> int:
    """K of the model that trains on ``schedule``: the allocated model's K, or more when a doubled quota exceeds it."""
    return max(num_pause, *schedule)


def halve_layer(quotas: Sequence[int], layer: int) -> list[int]:
    """The allocation probe: ``quotas`` with layer ``layer`` cut to half."""
    out = list(quotas)
    out[layer] = out[layer] // 2
    return out


def level_counts(num_layers: int) -> tuple[int, int]:
    """(layers doubled, layers halved): a sixth and a third (at least 1 and 2 for 3+ layers)."""
    if num_layers < 3:
        return 0, 0
    up = max(1, round(num_layers / 6))
    return up, 2 * up


def three_level_schedule(costs: Sequence[float], base: int) -> list[int]:
    """Three levels from per-layer costs, mean preserved (see module docstring).

    Ties break toward the lower layer index (stable ranking). The doubled layers need K >= 2q code
    positions per block (:func:`pause_positions_needed`): the paper allocates from a uniform K/2 model.
    """
    n = len(costs)
    up, down = level_counts(n)
    if down and base % 2:
        raise ValueError(f"halving an odd quota {base} would change the mean")
    order = sorted(range(n), key=lambda i: (-costs[i], i))
    quotas = [base] * n
    for i in order[:up]:
        quotas[i] = 2 * base
    for i in order[n - down :] if down else []:
        quotas[i] = base // 2
    return quotas
