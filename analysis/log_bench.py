"""``python -m analysis.log_bench BENCH.json [...]``: log bench results to W&B under the key scheme.

Every bench writes a JSON (``bench_decode``, ``bench_zoomr``, ``bench_abridge``, ``bench_throughput``, ...). This
logs each file as one W&B run of job type ``bench``: name ``<file stem>-<model>``, group ``--group`` or
``<model>/bench``, config = the file's ``meta`` (or ``args``) block, summary = every numeric leaf of the rest as
``bench/<path>`` (``bench/results/full/step_ms``, ``bench/rows/h2o-context1024-batch8/step_ms`` for a list of rows;
see :mod:`zoomr.tracking`). Offline without ``WANDB_API_KEY``
(``wandb sync`` later); the runs land under ``--dir`` (default: next to each JSON).
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path
from typing import Any

from zoomr.jsonl import BadRowError, read_json
from zoomr.tracking import log_summary_run

CONFIG_KEYS = ("meta", "args", "config", "settings")


# the fields that say which measurement a row of a bench's list is (bench_decode: policy, context and batch)
ROW_KEYS = ("policy", "mode", "arm", "server", "name", "length", "context", "batch", "block_size", "workers",
            "concurrency")  # fmt: skip


def row_label(row: Any) -> str | None:
    """``h2o-context1024-batch8`` for a row ``{"policy": "h2o", "context": 1024, "batch": 8, ...}``; None when the
    row names nothing of :data:`ROW_KEYS`."""
    if not isinstance(row, dict):
        return None
    parts = [v if isinstance(v, str) else f"{k}{v}" for k in ROW_KEYS
             if isinstance(v := row.get(k), str | int) and not isinstance(v, bool)]  # fmt: skip
    return "-".join(parts) or None


def flatten(obj: Any, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of nested dicts/lists as ``a/b/c`` keys (bools and strings left out). A list of rows is keyed
    by what each row measures (``rows/h2o-context1024-batch8/step_ms``, its identifying fields left out of the
    leaves) when that tells every row apart, else by position (``agreeability/0``)."""
    out: dict[str, float] = {}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else []
    if isinstance(obj, list) and None not in (labels := [row_label(r) for r in obj]) and len(set(labels)) == len(obj):
        items = ((label, {k: v for k, v in row.items() if k not in ROW_KEYS}) for label, row in zip(labels, obj))
    for k, v in items:
        key = f"{prefix}{k}"
        if isinstance(v, dict | list):
            out.update(flatten(v, key + "/"))
        elif isinstance(v, int | float) and not isinstance(v, bool):
            out[key] = float(v)
    return out


def read_bench(path: Path) -> tuple[str, dict[str, Any], dict[str, float]]:
    """The model, the config block and the numeric results of one bench JSON; one that is not an object or has no
    numeric result is refused naming the file (:class:`BadRowError`)."""
    data = read_json(path, "bench JSON")
    if not isinstance(data, dict):
        raise BadRowError(f"{path}: a bench JSON is an object, got {type(data).__name__}")
    config = next((data[k] for k in CONFIG_KEYS if isinstance(data.get(k), dict)), {})
    metrics = flatten({k: v for k, v in data.items() if k not in CONFIG_KEYS})
    if not metrics:
        raise BadRowError(f"{path}: no numeric results to log")
    return str(config.get("model") or data.get("model") or "model"), config, metrics


def log_file(path: Path, group: str | None, mode: str, run_dir: Path | None,
             bench: tuple[str, dict[str, Any], dict[str, float]] | None = None) -> dict[str, Any]:  # fmt: skip
    """Log one bench JSON (``bench``: what :func:`read_bench` read of it, read again when absent) as one run; the
    same file logged again (its path and bytes) resumes that run: it added another run of the same figures each
    time. A file rewritten by a new measurement is a new run."""
    model, config, metrics = bench or read_bench(path)
    key = f"{path.resolve()} {hashlib.sha256(path.read_bytes()).hexdigest()}"
    return log_summary_run(job_type="bench", name=f"{path.stem}-{model}", group=group or f"{model}/bench",
                           config={**config, "bench_file": str(path)}, metrics=metrics, mode=mode,
                           dir=run_dir or path.parent, run_key=key)  # fmt: skip


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(prog="python -m analysis.log_bench", description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="+", help="bench JSON files")
    p.add_argument("--group", default=None, help="W&B group (default <model>/bench)")
    p.add_argument("--mode", default="auto", choices=["auto", "online", "offline", "disabled"])
    p.add_argument("--dir", default=None, help="where the W&B run files go (default: next to each JSON)")
    a = p.parse_args(argv)
    missing = [f for f in a.files if not Path(f).is_file()]
    if missing:
        p.error(f"no such bench JSON: {', '.join(missing)}")
    # every file read before the first run is logged (a torn or unloggable one is named, none logged)
    benches = [read_bench(Path(f)) for f in a.files]
    out = []
    for f, bench in zip(a.files, benches):
        summary = log_file(Path(f), a.group, a.mode, Path(a.dir) if a.dir else None, bench)
        print(f"{f}: {len(summary)} summary keys logged")
        out.append(summary)
    return out


if __name__ == "__main__":
    from zoomr.script import run_script

    run_script(main)
