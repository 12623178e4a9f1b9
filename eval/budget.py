"""Row budgets relative to the run: ``method.budget_fraction`` / ``method.budget_match`` -> ``budget_rows``.

A fixed ``budget_rows`` only means something next to the lengths the run produces: at the tiny defaults
(peaks of ~200 rows) the baselines' default 1,024 never evicts. Two relative forms, resolved once before
decoding from finished run directories (their ``metrics.json``) and written into the run's config and
fingerprint as plain ``budget_rows``, so a rerun resumes only while the reference says the same:

- ``budget_fraction=f``: f x the rows full KV holds at the end of a sequence (pooled mean of its peak
  resident rows per layer and KV head), read from ``budget_reference`` — by default the full-KV run of the
  same benchmark and model (``runs/eval/<benchmark>/<model>/full``): the testbed's "25% of full KV".
- ``budget_match=<run dir>``: the mean resident rows over decoding of another arm (e.g. ZoomR or
  AbridgeKV), AbridgeKV's matched-memory comparison (``zoomr.cache.match_budget``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from zoomr.jsonl import read_json_object
from zoomr.schemas.checks import SettingsError, is_finite_number

log = logging.getLogger(__name__)

FULL_POLICIES = (None, "full", "offload")


def _reference(run_dir: Path, what: str, fix: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pooled metrics, config) of a finished run directory, or a SystemExit saying what to run."""
    metrics_file = run_dir / "metrics.json"
    if not metrics_file.is_file():
        raise SystemExit(f"{what} needs the measured rows of {run_dir}, which has no metrics.json: {fix}")
    pooled = read_json_object(metrics_file, "eval metrics").get("pooled")
    if not isinstance(pooled, dict) or not {"rows_mean", "rows_peak_mean"} <= set(pooled):
        raise SystemExit(f"{what}: {metrics_file} has no pooled rows_mean / rows_peak_mean (not an eval run's metrics)")
    wrong = {k: pooled[k] for k in ("rows_mean", "rows_peak_mean") if not is_finite_number(pooled[k]) or pooled[k] < 0}
    if wrong:  # null was a TypeError traceback, NaN a budget of 'nan' rows
        shown = ", ".join(f"{k}={v!r}" for k, v in wrong.items())
        raise SystemExit(f"{what}: {metrics_file} has pooled {shown}, not a number of rows (a damaged metrics.json)")
    config_file = run_dir / "config.json"
    config = read_json_object(config_file, "run config") if config_file.is_file() else {}
    return pooled, config


def _check_same(config: dict[str, Any], benchmark: str, model: str, where: Path) -> None:
    theirs = ((config.get("benchmark") or {}).get("name"), (config.get("model") or {}).get("name"))
    if config and theirs != (benchmark, model):
        log.warning(
            "budget reference %s ran benchmark %s / model %s, this run %s / %s: its rows may not transfer",
            where, *theirs, benchmark, model,
        )  # fmt: skip


def resolve_budget(cfg: Any, config: Any = None) -> str | None:
    """Turn a relative budget of ``cfg.method`` into ``budget_rows`` in place; return how it was set.

    ``config``: ``cfg.method``'s policy config dataclass when the caller has typed it already (python -m
    eval: :func:`eval.settings.validate`). Call before the fingerprint and ``config.json`` are written.
    Returns None when the method has no relative budget (or no method is set).
    """
    from omegaconf import open_dict

    from zoomr.cache import match_budget, policy_config

    method = cfg.get("method")
    if method is None or not method.get("policy"):
        return None
    config = policy_config(method) if config is None else config
    if not getattr(config, "budget_pending", False):  # a budget on a policy without one is refused by its config
        return None
    benchmark, model = cfg.benchmark.name, cfg.model.name
    if config.budget_fraction is not None:
        ref = Path(config.budget_reference or Path(cfg.run_dir).parent / "full")
        fix = (
            f"run full KV first (python -m eval benchmark={benchmark} model={model} with the same generation "
            "settings, no +method) or point method.budget_reference at a full-KV run directory"
        )
        what = f"method.budget_fraction={config.budget_fraction}"
        pooled, ref_config = _reference(ref, what, fix)
        policy = (ref_config.get("method") or {}).get("policy")
        if policy not in FULL_POLICIES:
            raise SystemExit(f"method.budget_reference={ref} is a {policy!r} run, not full KV: {fix}")
        full_rows = pooled["rows_peak_mean"]
        rows = config.budget_fraction * full_rows
        note = f"{config.budget_fraction:g} x full KV's {full_rows:.1f} rows ({ref})"
    else:
        ref = Path(config.budget_match)
        fix = "finish that run first (rerun its command) or give a finished run directory"
        what = f"method.budget_match={ref}"
        pooled, ref_config = _reference(ref, what, fix)
        rows = pooled["rows_mean"]
        note = f"the mean resident rows of {ref}"
    _check_same(ref_config, benchmark, model, ref)
    try:
        resolved = match_budget(config, rows)
    except ValueError as e:  # e.g. SnapKV's window above the rows a small fraction leaves
        raise SettingsError(
            f"{what}: {note} is budget_rows={rows:.0f}, which {config.name} cannot use ({e}); give a larger "
            "budget or a smaller window"
        ) from None
    with open_dict(cfg.method):
        cfg.method.budget_rows = resolved.budget_rows
        cfg.method.budget_fraction = cfg.method.budget_reference = cfg.method.budget_match = None
    note = f"budget_rows={resolved.budget_rows}: {note}"
    log.info("%s: %s", config.name, note)
    return note
