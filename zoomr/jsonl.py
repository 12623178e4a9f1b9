"""One reader for every JSONL file the project loads (and for JSON files given by users): bad rows are counted and
skipped with their file and line, or the file is refused naming the row; never a traceback from deep inside a parser.

A line is *bad* when it is not UTF-8, not JSON, not a JSON object (``null``, a list, a string), or
when the caller's ``check`` rejects it (a missing or empty field). Blank lines are ignored.
``torn_tail=True`` is for append-only files written line by line (``eval.results``): a last line
without its newline is an interrupted write, reported separately (``torn``) so the writer can cut it.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

BOM = b"\xef\xbb\xbf"  # UTF-8's byte-order mark
Check = Callable[[dict[str, Any]], str | None]  # row -> reason it is unusable, or None


class BadRowError(ValueError):
    """A file refused because of one row (``on_bad="refuse"``); the message names file, line and reason."""


@dataclass(frozen=True)
class BadRow:
    path: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path} line {self.line}: {self.reason}"


def parse_line(raw: bytes) -> dict[str, Any] | str:
    """The JSON object on one line, or the reason it is unusable (``not_utf8``, ``bad_json``, ``not_an_object``)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "not_utf8"
    try:
        row = json.loads(text)
    except ValueError:
        return "bad_json"
    if not isinstance(row, dict):
        return f"not_an_object ({type(row).__name__})"
    return row


@dataclass
class JsonlReader:
    """``for line, row in JsonlReader(path): ...``; afterwards ``bad``, ``reasons``, ``clean_end``, ``torn``.

    ``on_bad``: ``skip`` (count, log the first ``log_first``, go on) or ``refuse`` (raise
    :class:`BadRowError` at the first bad row). ``clean_end``: byte offset just past the last complete line.
    """

    path: str | Path
    check: Check | None = None
    on_bad: str = "skip"
    torn_tail: bool = False
    log_first: int = 5
    rows: int = 0
    bad: list[BadRow] = field(default_factory=list)
    clean_end: int = 0
    torn: int = 0  # bytes of an unterminated last line (torn_tail=True only)

    def __post_init__(self) -> None:
        if self.on_bad not in ("skip", "refuse"):
            raise ValueError(f"on_bad must be skip|refuse, got {self.on_bad!r}")

    @property
    def reasons(self) -> Counter:
        """Bad rows by reason (the part of the reason before any parenthesis)."""
        return Counter(b.reason.split(" (")[0] for b in self.bad)

    def _reject(self, lineno: int, reason: str) -> None:
        bad = BadRow(str(self.path), lineno, reason)
        if self.on_bad == "refuse":
            raise BadRowError(f"{bad}; fix or remove that row")
        self.bad.append(bad)
        if len(self.bad) <= self.log_first:
            log.warning("skipping %s", bad)

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any]]]:
        offset = 0
        with open(self.path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                end = offset + len(raw)
                if self.torn_tail and not raw.endswith(b"\n"):
                    self.torn = len(raw)
                    return
                offset = self.clean_end = end
                if not raw.strip():
                    continue
                self.rows += 1
                if lineno == 1 and raw.startswith(BOM):  # a file saved by an editor that marks UTF-8 (Notepad)
                    raw = raw[len(BOM):]
                row = parse_line(raw.strip())
                reason = row if isinstance(row, str) else (self.check(row) if self.check else None)
                if reason is not None:
                    self._reject(lineno, reason)
                    continue
                yield lineno, row

    def summary(self) -> str:
        parts = ", ".join(f"{k}: {v}" for k, v in sorted(self.reasons.items())) or "none"
        return f"{self.path}: {self.rows - len(self.bad)}/{self.rows} rows read; bad rows: {parts}"


def read_jsonl(path: str | Path, check: Check | None = None, on_bad: str = "refuse") -> list[dict[str, Any]]:
    """Every row of a JSONL file (a convenience over :class:`JsonlReader`; refuses a bad row by default)."""
    reader = JsonlReader(path, check, on_bad)
    rows = [row for _, row in reader]
    if reader.bad:
        log.warning("%s", reader.summary())
    return rows


def read_json(path: str | Path, what: str = "file") -> Any:
    """The JSON value in ``path``; a file that is not UTF-8 JSON is refused with :class:`BadRowError` naming the
    file, ``what`` it should be, and where the parser stopped."""
    try:
        return json.loads(Path(path).read_bytes().decode("utf-8-sig"))  # -sig: a leading byte-order mark is no error
    except UnicodeDecodeError:
        raise BadRowError(f"{path}: not a UTF-8 text file (expected a JSON {what})") from None
    except json.JSONDecodeError as e:
        raise BadRowError(
            f"{path}: not valid JSON (expected a JSON {what}; {e.msg} at line {e.lineno} column {e.colno})"
        ) from None


def read_json_object(path: str | Path, what: str = "file") -> dict[str, Any]:
    """The JSON object in ``path``, refused like :func:`read_json`, and also when it is not an object."""
    data = read_json(path, what)
    if not isinstance(data, dict):
        raise BadRowError(f"{path}: expected a JSON object ({what}), got a {type(data).__name__}")
    return data
