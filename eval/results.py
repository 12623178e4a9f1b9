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

from zoomr.jsonl import BadRowError, JsonlReader, read_json_object
from zoomr.rundir import write_json

log = logging.getLogger(__name__)

RESULTS_FILE = "results.jsonl"
FINGERPRINT_FILE = "fingerprint.json"

Key = tuple[str, int]


def row_key(row: dict[str, Any]) -> Key:
    return (row["problem_id"], int(row["sample"]))


def is_grading_error(row: dict[str, Any]) -> bool:
    """A row whose grading did not finish (a grader worker died or failed): regraded on the next run."""
    return row.get("grade_method") == "error"


def _row_problem(row: dict[str, Any]) -> str | None:
    if not isinstance(row.get("problem_id"), str) or type(row.get("sample")) is not int:
        return "not a result row (needs a string problem_id and an integer sample)"
    if not isinstance(row.get("correct"), bool):
        return "not a result row (needs a boolean correct)"
    return None


class ResultStore:
    """Append-only JSONL of sample rows in ``run_dir``."""

    def __init__(self, run_dir: str | Path, fsync: bool = True):
        self.path = Path(run_dir) / RESULTS_FILE
        self.fsync = fsync
        self.rows: dict[Key, dict[str, Any]] = {}
        self.duplicates = 0
        self.torn = 0
        self.bad = 0

    def load(self, repair: bool = True) -> dict[Key, dict[str, Any]]:
        """Read existing rows; repair a torn last line so later appends start on a clean line.

        Unreadable lines (not UTF-8, not JSON, not a row of this file) are skipped with their line number
        (counted in ``bad``); their keys, if any, are regenerated. A later row of a key replaces a row whose
        grading failed (``grade_method == "error"``, see :mod:`eval.grading`); otherwise the first row wins.
        ``repair=False`` (readers of another process's run: eval.compare, paper_tables) leaves the file as it is:
        a torn last line may be a row the run is still writing.
        """
        self.rows = {}
        if not self.path.exists():
            return self.rows
        reader = JsonlReader(self.path, check=_row_problem, torn_tail=True)
        for _, row in reader:
            key = row_key(row)
            if key in self.rows and not is_grading_error(self.rows[key]):
                self.duplicates += 1
            else:
                self.rows[key] = row
        self.bad = len(reader.bad)
        if reader.torn and repair:
            self.torn += 1
            log.warning("%s: dropping a torn last line (%d bytes)", self.path, reader.torn)
            with open(self.path, "r+b") as f:
                f.truncate(reader.clean_end)
        return self.rows

    def append(self, row: dict[str, Any]) -> None:
        key = row_key(row)
        if key in self.rows and not is_grading_error(self.rows[key]):
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
        write_json(path, current)  # a kill leaves no fingerprint or the whole one
        return
    try:
        previous = read_json_object(path, "eval fingerprint")
    except BadRowError as e:
        raise BadRowError(
            f"{e}: the rows in {run_dir} cannot be matched to their settings; move the directory aside, or delete "
            f"{FINGERPRINT_FILE} if they came from this same command"
        ) from None
    if isinstance(previous.get("method"), dict):  # written before training-only fields left the fingerprint
        from zoomr.cache.registry import serving_settings

        previous = {**previous, "method": serving_settings(previous["method"])}
    if previous != current:
        diffs = _diff(with_recorded_length(previous, current.get("benchmark", {}).get("length")), current)
        if not diffs:  # only keys added since (a new setting at its null default, the length): the same settings
            write_json(path, current)
            return
        raise SystemExit(
            f"{run_dir} holds results of different settings:\n  "
            + "\n  ".join(diffs[:20])
            + "\nUse another run_name (or delete the directory) to keep both experiments apart."
        )


def with_recorded_length(fingerprint: dict[str, Any], length: Any) -> dict[str, Any]:
    """``fingerprint`` with ``benchmark.length`` set to ``length`` where it was written before the length was part of
    it (2026-12-06): the length such a run used is not known, and it was not compared then."""
    bench = fingerprint.get("benchmark")
    if not isinstance(bench, dict) or "length" in bench:
        return fingerprint
    return {**fingerprint, "benchmark": {**bench, "length": length}}


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [f"{prefix.rstrip('.')}: was {a!r}, now {b!r}"]
