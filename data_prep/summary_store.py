"""Persistent summaries keyed by (paragraph hash, model, prompt version), one SQLite row per summary.

Each finished summary is committed at once (WAL journal), so a crash or Ctrl-C loses at most the
requests in flight, and a rerun asks the server only for what is missing. The paragraph hash covers
the problem text too, because the summariser sees both (ZoomR A.1). The request settings that shape a summary
(``max_tokens``, ``temperature``, ...) are recorded once per (model, prompt version): a store is reused only under
the same ones (:func:`check_request_settings`), so summaries asked for under other settings are never reused silently.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from zoomr.jsonl import BadRowError
from zoomr.paths import MissingInput, output_problem
from zoomr.rundir import changed_settings
from zoomr.schemas.checks import SettingsError

SCHEMA = """
CREATE TABLE IF NOT EXISTS summaries (
    paragraph_hash TEXT NOT NULL,
    model TEXT NOT NULL,
    prompt_version TEXT NOT NULL,
    summary TEXT NOT NULL,
    finish_reason TEXT,
    prompt_tokens INTEGER,
    completion_tokens INTEGER,
    attempts INTEGER,
    created REAL NOT NULL,
    PRIMARY KEY (paragraph_hash, model, prompt_version)
);
CREATE TABLE IF NOT EXISTS request_settings (
    model TEXT NOT NULL,
    prompt_version TEXT NOT NULL,
    settings TEXT NOT NULL,
    PRIMARY KEY (model, prompt_version)
)
"""
COLUMNS = {  # of each table above: a table of that name without them is another program's (sqlite's "no such column")
    "summaries": ("paragraph_hash", "model", "prompt_version", "summary", "finish_reason", "prompt_tokens",
                  "completion_tokens", "attempts", "created"),
    "request_settings": ("model", "prompt_version", "settings"),
}  # fmt: skip


def schema_problem(db: sqlite3.Connection) -> str | None:
    """Why ``db``'s tables are not a summary store's (a table of a store's name lacking a column), or None."""
    for table, columns in COLUMNS.items():
        have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
        if have and (lacking := [c for c in columns if c not in have]):
            return f"its table {table} has no column {', '.join(lacking)}"
    return None


def check_request_settings(path: str | Path, model: str, prompt_version: str, settings: dict) -> None:
    """Refuse, reading ``path`` only, settings other than those the store's summaries for (``model``,
    ``prompt_version``) were asked for under, naming each field; a store without a record (new, or made before
    2026-12-06) passes and records them when opened. A path no store can be at is refused too."""
    path = Path(path)
    check_store_path(path)
    if not path.is_file():
        return
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            if problem := schema_problem(db):
                raise not_a_store(path, problem)
            row = db.execute(
                "SELECT settings FROM request_settings WHERE model=? AND prompt_version=?", (model, prompt_version)
            ).fetchone()
    except sqlite3.OperationalError:  # no such table: an older store
        return
    except sqlite3.DatabaseError as e:  # another file at the store's path
        raise not_a_store(path, e) from None
    if row is None:
        return
    try:
        recorded = json.loads(row[0])
    except (TypeError, ValueError):
        recorded = None
    if not isinstance(recorded, dict):  # a JSONDecodeError / AttributeError traceback
        raise not_a_store(path, f"its request settings for {model} are not a JSON object: {str(row[0])[:80]!r}")
    named = lambda d: {f"pipeline.endpoint.{k}": v for k, v in d.items()}  # noqa: E731
    changed = changed_settings(named(recorded), named(settings))
    if changed:
        raise SettingsError(
            f"{path} holds summaries by {model} asked for under other settings ({'; '.join(changed)}); they would be "
            "reused as if asked for now: give the same settings to reuse them, or another pipeline.store (or "
            "pipeline.out_dir) to ask again"
        )


def check_store_path(path: Path) -> None:
    """Refuse a store path no store can be at (a directory, or under a file): sqlite's 'unable to open database
    file' traceback otherwise, after the run directory was written."""
    if problem := output_problem(path, directory=False):
        raise MissingInput(f"summary store {problem} (pipeline.store)")


def not_a_store(path: Path, error: Exception | str) -> BadRowError:
    return BadRowError(f"{path}: not a summary store ({error}); give pipeline.store another path")


def paragraph_hash(problem: str, paragraph: str) -> str:
    return hashlib.sha256(f"{problem}\x00{paragraph}".encode()).hexdigest()


class StoreUnavailable(MissingInput):
    """The store could not be written (e.g. locked by another process past ``lock_timeout_s``): the run stops like
    on a fatal endpoint error, writing what finished, instead of ending in sqlite's traceback."""


@dataclass(frozen=True)
class StoredSummary:
    summary: str
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    attempts: int | None


class SummaryStore:
    """``SummaryStore(path, model, prompt_version, accept, request_settings)``: get / put / missing over paragraph
    hashes. ``request_settings``: checked against, or else recorded as, those of the store's earlier summaries.

    ``accept(stored)`` is False for a stored summary this run would have rejected (e.g. one cut by ``max_tokens``,
    stored by a run with ``reject_truncated_answers=false``): ``get`` does not return it and ``missing`` lists it,
    so it is asked for again and replaced instead of being reused as a good summary."""

    def __init__(
        self,
        path: str | Path,
        model: str,
        prompt_version: str,
        accept: Callable[[StoredSummary], bool] | None = None,
        request_settings: dict | None = None,
        lock_timeout_s: float = 60.0,
    ):
        self.path = Path(path)
        check_store_path(self.path)
        self.accept = accept
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.model = model
        self.prompt_version = prompt_version
        self._db = sqlite3.connect(str(self.path), timeout=lock_timeout_s)  # waits for another writer's lock
        try:
            if problem := schema_problem(self._db):  # before anything is written to another program's database
                raise sqlite3.DatabaseError(problem)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)
            if request_settings is not None:
                check_request_settings(self.path, model, prompt_version, request_settings)
                self._db.execute("INSERT OR IGNORE INTO request_settings VALUES (?,?,?)",
                                 (model, prompt_version, json.dumps(request_settings, sort_keys=True)))  # fmt: skip
            self._db.commit()
        except sqlite3.OperationalError as e:  # locked by another process past lock_timeout_s, a read-only file, ...
            self._db.close()
            raise StoreUnavailable(f"summary store {self.path}: {e} (is another process writing it?)") from None
        except sqlite3.DatabaseError as e:  # another file at the store's path
            self._db.close()
            raise not_a_store(self.path, e) from None
        except SettingsError:
            self._db.close()
            raise

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> SummaryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, key: str) -> StoredSummary | None:
        row = self._db.execute(
            "SELECT summary, finish_reason, prompt_tokens, completion_tokens, attempts FROM summaries "
            "WHERE paragraph_hash=? AND model=? AND prompt_version=?",
            (key, self.model, self.prompt_version),
        ).fetchone()
        stored = StoredSummary(*row) if row else None
        return stored if stored is not None and (self.accept is None or self.accept(stored)) else None

    def put(self, key: str, value: StoredSummary) -> None:
        try:
            self._put(key, value)
        except sqlite3.OperationalError as e:  # "database is locked", a full disk, ...
            raise StoreUnavailable(f"summary store {self.path}: {e} (is another process writing it?)") from None

    def _put(self, key: str, value: StoredSummary) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO summaries VALUES (?,?,?,?,?,?,?,?,?)",
            (
                key,
                self.model,
                self.prompt_version,
                value.summary,
                value.finish_reason,
                value.prompt_tokens,
                value.completion_tokens,
                value.attempts,
                time.time(),
            ),
        )
        self._db.commit()

    def missing(self, keys: list[str]) -> list[str]:
        """The keys (order kept, duplicates dropped) with no accepted stored summary for this model and prompt."""
        have = {
            r[0]
            for r in self._db.execute(
                "SELECT paragraph_hash, summary, finish_reason, prompt_tokens, completion_tokens, attempts "
                "FROM summaries WHERE model=? AND prompt_version=?",
                (self.model, self.prompt_version),
            )
            if self.accept is None or self.accept(StoredSummary(*r[1:]))
        }
        return [k for k in dict.fromkeys(keys) if k not in have]

    def __len__(self) -> int:
        return self._db.execute(
            "SELECT COUNT(*) FROM summaries WHERE model=? AND prompt_version=?",
            (self.model, self.prompt_version),
        ).fetchone()[0]
