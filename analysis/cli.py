"""Shared by the analysis scripts' command lines: argument checks (refused before any model loads or file is
written), where a benchmark writes its report, and its console lines."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from zoomr.rundir import write_text_atomic


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


def require_device(parser: argparse.ArgumentParser, device: str) -> None:
    """``parser.error`` unless ``--device`` is cpu, cuda or a cuda:N this machine has (``mps``, a typo or a missing GPU
    failed in torch after the run had started: gpu_check wrote a report of one error per section, exit status 0)."""
    from zoomr.entry import device_problem

    if (problem := device_problem(device, auto=False)) is not None:
        parser.error(f"--device {device}: {problem}")


def require_checkpoint(parser: argparse.ArgumentParser, path: str, option: str = "--model") -> None:
    """``parser.error`` unless ``path`` is a saved model directory (a ``config.json`` in it)."""
    if not (Path(path) / "config.json").is_file():
        parser.error(f"{option} {path}: not a checkpoint directory (no config.json)")


def require_testbed_data(parser: argparse.ArgumentParser, path: str, option: str = "--model", **overrides: Any):
    """The testbed checkpoint's data settings with ``overrides`` (``trained_data``), checked as the generator checks
    them (``zoomr.testbed.task.validate``); ``parser.error`` naming the checkpoint if they are impossible."""
    from zoomr.testbed.checkpoint import trained_data
    from zoomr.testbed.task import validate

    try:
        data = trained_data(path, **overrides)
        validate(data)
    except ValueError as e:
        parser.error(f"{option} {path}: {e}")
    return data


def bench_out_dir(out: str | None, name: str, tag: str = "") -> Path:
    """``out`` if given, else ``runs/<name>/<tag-><time>/`` under the working directory (never the package)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(out) if out else Path.cwd() / "runs" / name / (f"{tag}-{stamp}" if tag else stamp)


def write_bench_report(out: Path, stem: str, report: dict[str, Any], table: str) -> Path:
    """Print ``table``; write ``<out>/<stem>.json`` (``report``) and ``<stem>.md`` (the table); the JSON's path."""
    print("\n" + table)
    out.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out / f"{stem}.json", json.dumps(report, indent=2))  # whole: a kill leaves the old or the new
    write_text_atomic(out / f"{stem}.md", table + "\n")
    print(f"\nwrote {out / f'{stem}.json'}")
    return out / f"{stem}.json"


def write_bench_json(out: str | Path | None, name: str, tag: str, report: dict[str, Any], table: str) -> Path:
    """Print ``table``; write ``report`` to ``out``, else ``runs/<name>/bench-<tag>-<time>.json`` under the working
    directory; the path written."""
    print("\n" + table)
    path = Path(out) if out else Path.cwd() / "runs" / name / f"bench-{tag}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(report, indent=2))
    print(f"\nwrote {path}")
    return path


def brief(value: Any) -> Any:
    """``value`` (a result, nested dicts and lists) with every float at 4 significant digits, for a console line
    (the JSON keeps them whole)."""
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: brief(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(brief(v) for v in value)
    return value
