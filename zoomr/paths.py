"""Where the repository's vendored files live, so relative paths in configs work from any cwd."""

from __future__ import annotations

import errno
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def resolve_repo_path(path: str | Path) -> Path:
    """``path`` if it exists as given (absolute or relative to the cwd), else relative to the repo root."""
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p
    return REPO_ROOT / p


class MissingInput(FileNotFoundError):
    """A path the user gave (a model, a data file) names nothing usable; entry points print the message alone."""


class OutputUnwritable(OSError):
    """A finished file could not be put in place (a full disk or quota, a file system gone read-only); the file
    there before is kept. Entry points print the message alone."""


FULL_OR_READ_ONLY = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)  # the output, not the code


def output_problem(path: str | Path, directory: bool) -> str | None:
    """Why nothing can be written at ``path`` (a directory to create or fill when ``directory``, else a file), or
    None: it names a file (directory) or a directory (file), an ancestor of it is a file, or the directory it would
    be written in (itself, or its nearest existing ancestor) takes no new entry: a read-only file system, no
    permission, a path under /proc (tried by making and removing an empty directory there)."""
    p = Path(path).expanduser()
    if p.exists() and p.is_dir() != directory:
        return f"{path} is a {'file' if directory else 'directory'}; give a {'directory' if directory else 'file path'}"
    blocker = next((a for a in p.parents if a.exists()), None)
    if blocker is not None and not blocker.is_dir():
        return f"{path}: {blocker} is a file, so nothing can be written under it"
    where = p if p.is_dir() else blocker
    if where is not None and (reason := _refuses_entries(where)):
        return f"{path} cannot be written ({reason} in {where}); give a writable {'directory' if directory else 'path'}"
    return None


def _refuses_entries(directory: Path) -> str | None:
    """Why ``directory`` takes no new entry (None: it does), found by making and removing an empty directory in it:
    ``os.access`` says yes to root on a read-only path's permission bits, and to anyone under /proc."""
    import tempfile

    try:
        os.rmdir(tempfile.mkdtemp(prefix=".zoomr-write-check-", dir=directory))
    except OSError as e:
        return e.strerror or type(e).__name__
    return None


FILE_SUFFIXES = (".json", ".jsonl", ".md", ".csv", ".tex", ".png", ".pdf", ".txt")  # never a directory's name


def output_dir(value: str) -> str:
    """argparse ``type=`` of an ``--out`` directory: refused when the command line is read, not at the first write
    after the tool's work (a traceback that lost the work)."""
    import argparse

    if problem := output_problem(value, directory=True):
        raise argparse.ArgumentTypeError(problem)
    suffix = Path(value).suffix.lower()
    if suffix in FILE_SUFFIXES and not Path(value).expanduser().is_dir():  # `--out x.json` made a directory x.json
        raise argparse.ArgumentTypeError(
            f"{value} names a {suffix} file, but this --out is the directory the tool writes its files in; give a directory"
        )
    return value


def output_file(value: str) -> str:
    """argparse ``type=`` of an ``--out`` file (a JSON report), refused like :func:`output_dir`."""
    import argparse

    if problem := output_problem(value, directory=False):
        raise argparse.ArgumentTypeError(problem)
    return value
