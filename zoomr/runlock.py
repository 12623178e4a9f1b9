"""One writer per run directory: an exclusive ``flock`` on ``<run_dir>/.lock``.

An eval holds it while it appends rows (:class:`RunLock` as a context manager); a trainer holds it from the
moment :func:`zoomr.rundir.prepare_run` checks the directory until the process exits (:func:`hold_run_lock`).
A second eval, or a second training, on the same directory is refused at once, naming the holder's pid:
two trainings there resumed from each other's checkpoints and wrote ``final/`` in turn. The lock is the
kernel's, so it is released when its holder exits or is killed; a stale ``.lock`` file blocks nothing.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"


class RunLock:
    """An exclusive, non-blocking ``flock`` on ``run_dir/.lock`` (``what`` names the writer in the refusal, ``instead``
    what to do about it)."""

    def __init__(self, run_dir: str | Path, what: str = "eval", instead: str = "use another run_name / run_dir"):
        self.path = Path(run_dir) / LOCK_FILE
        self.what = what
        self.instead = instead
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        import fcntl

        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise SystemExit(
                f"{self.path.parent} is being written by another {self.what} (pid {holder}); wait for it to finish, "
                f"or {self.instead}"
            ) from None
        except OSError as e:  # a file system without flock (e.g. Lustre mounted without it): run unguarded
            log.warning("%s: cannot lock (%s); a second writer of this directory would not be refused", self.path, e)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = None


_HELD: dict[Path, RunLock] = {}


def hold_run_lock(run_dir: str | Path, what: str = "training", instead: str = "use another run_name / run_dir") -> None:
    """Take ``run_dir``'s lock for the rest of this process (again in the same process: a no-op)."""
    key = Path(run_dir).resolve()
    if key not in _HELD:
        _HELD[key] = RunLock(run_dir, what, instead).__enter__()


def release_run_lock(run_dir: str | Path) -> None:
    """Give up a lock taken by :func:`hold_run_lock` (tests; a process's locks also end with it)."""
    lock = _HELD.pop(Path(run_dir).resolve(), None)
    if lock is not None:
        lock.__exit__()
