"""One experiment-tracking helper for every entry point (W&B, or a null logger).

Mode ``auto``: online when ``WANDB_API_KEY`` is set, offline otherwise; the ``WANDB_MODE``
environment variable, when set, wins (tests set it to ``disabled``). The API key is never printed
or logged: the resolved config we upload is scrubbed of anything that looks like a secret.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
_SECRET_MARKERS = ("api_key", "apikey", "token", "secret", "password")


def resolve_mode(mode: str) -> str:
    env = os.environ.get("WANDB_MODE")
    if env:
        return env
    if mode == "auto":
        return "online" if os.environ.get("WANDB_API_KEY") else "offline"
    if mode not in ("online", "offline", "disabled"):
        raise ValueError(f"logger.mode must be auto|online|offline|disabled, got {mode!r}")
    return mode


def scrub_secrets(obj: Any) -> Any:
    """Replace values whose key names a secret with '***' (recursively)."""
    if isinstance(obj, dict):
        return {
            k: "***" if any(m in str(k).lower() for m in _SECRET_MARKERS) and v else scrub_secrets(v)
            for k, v in obj.items()
        }
    if isinstance(obj, list):
        return [scrub_secrets(v) for v in obj]
    return obj


class RunLogger:
    """Thin wrapper over a wandb run; every method is a no-op when disabled."""

    def __init__(self, run: Any = None):
        self.run = run

    @property
    def enabled(self) -> bool:
        return self.run is not None

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        if self.run is not None:
            self.run.log(metrics, step=step)

    def summary(self, metrics: dict[str, Any]) -> None:
        if self.run is not None:
            self.run.summary.update(metrics)

    def table(self, key: str, columns: list[str], rows: list[list[Any]]) -> None:
        if self.run is not None:
            import wandb

            self.run.log({key: wandb.Table(columns=columns, data=rows)})

    def image(self, key: str, path: str | Path) -> None:
        if self.run is not None:
            import wandb

            self.run.log({key: wandb.Image(str(path))})

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None


def init_run(
    *,
    project: str,
    name: str,
    group: str | None,
    config: dict[str, Any],
    mode: str = "auto",
    entity: str | None = None,
    tags: list[str] | None = None,
    dir: str | Path | None = None,
    job_type: str | None = None,
) -> RunLogger:
    """Start a W&B run (or return a disabled logger). ``config`` is the resolved config, scrubbed."""
    mode = resolve_mode(mode)
    if mode == "disabled":
        return RunLogger(None)
    import wandb

    run = wandb.init(
        project=project,
        entity=entity,
        name=name,
        group=group,
        tags=tags or None,
        job_type=job_type,
        config=scrub_secrets(config),
        mode=mode,
        dir=str(dir) if dir else None,
        reinit="finish_previous",
    )
    log.info("W&B run %s (%s)", name, mode)
    return RunLogger(run)
