"""Resumable results: one JSONL row per (problem, sample), appended and flushed as each is graded.

A killed run loses at most the samples in flight: on restart :meth:`ResultStore.load` drops a torn
last line (a write interrupted by the kill), keeps the first row of any key, and the runner skips
every finished key. ``fingerprint.json`` records what decides the rows' content (model, method,
benchmark, sampling, grading); a rerun into the same directory with different settings is refused
instead of mixing two experiments in one file.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

RESULTS_FILE = "results.jsonl"
FINGERPRINT_FILE = "fingerprint.json"

Key = tuple[str, int]


def row_key(row: dict[str, Any]) -> Key:
    return (row["problem_id"], int(row["sample"]))


class ResultStore:
    """Append-only JSONL of sample rows in ``run_dir``."""

    def __init__(self, run_dir: str | Path, fsync: bool = True):
        self.path = Path(run_dir) / RESULTS_FILE
        self.fsync = fsync
        self.rows: dict[Key, dict[str, Any]] = {}
        self.duplicates = 0
        self.torn = 0

    def load(self) -> dict[Key, dict[str, Any]]:
        """Read existing rows; repair a torn last line so later appends start on a clean line."""
        self.rows = {}
        if not self.path.exists():
            return self.rows
        data = self.path.read_bytes()
        good_end = 0
        pos = 0
        while pos < len(data):
            nl = data.find(b"\n", pos)
            if nl < 0:  # last line without newline: the write in flight when the run was killed
                self.torn += 1
                break
            line = data[pos:nl].strip()
            if line:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    self.torn += 1
                    log.warning("%s: skipping an unreadable line at byte %d", self.path, pos)
                    pos = nl + 1
                    good_end = pos
                    continue
                key = row_key(row)
                if key in self.rows:
                    self.duplicates += 1
                else:
                    self.rows[key] = row
            pos = nl + 1
            good_end = pos
        if good_end < len(data):
            log.warning("%s: dropping a torn last line (%d bytes)", self.path, len(data) - good_end)
            with open(self.path, "r+b") as f:
                f.truncate(good_end)
        return self.rows

    def append(self, row: dict[str, Any]) -> None:
        key = row_key(row)
        if key in self.rows:
            raise ValueError(f"result for {key} already written")
        line = json.dumps(row, ensure_ascii=False) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        self.rows[key] = row


def check_fingerprint(run_dir: str | Path, fingerprint: dict[str, Any]) -> None:
    """Write the fingerprint on the first run; refuse a rerun whose settings differ."""
    path = Path(run_dir) / FINGERPRINT_FILE
    current = json.loads(json.dumps(fingerprint, default=str))
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(current, indent=2, sort_keys=True))
        return
    previous = json.loads(path.read_text())
    if previous != current:
        diffs = _diff(previous, current)
        raise SystemExit(
            f"{run_dir} holds results of different settings:\n  "
            + "\n  ".join(diffs[:20])
            + "\nUse another run_name (or delete the directory) to keep both experiments apart."
        )


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [f"{prefix.rstrip('.')}: was {a!r}, now {b!r}"]
