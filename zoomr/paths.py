"""Where the repository's vendored files live, so relative paths in configs work from any cwd."""

from __future__ import annotations

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


def output_problem(path: str | Path, directory: bool) -> str | None:
    """Why nothing can be written at ``path`` (a directory to create or fill when ``directory``, else a file), or
    None: it names a file (directory) or a directory (file), or an ancestor of it is a file."""
    p = Path(path).expanduser()
    if p.exists() and p.is_dir() != directory:
        return f"{path} is a {'file' if directory else 'directory'}; give a {'directory' if directory else 'file path'}"
    blocker = next((a for a in p.parents if a.exists()), None)
    if blocker is not None and not blocker.is_dir():
        return f"{path}: {blocker} is a file, so nothing can be written under it"
    return None


def output_dir(value: str) -> str:
    """argparse ``type=`` of an ``--out`` directory: refused when the command line is read, not at the first write
    after the tool's work (a traceback that lost the work)."""
    import argparse

    if problem := output_problem(value, directory=True):
        raise argparse.ArgumentTypeError(problem)
    return value


def output_file(value: str) -> str:
    """argparse ``type=`` of an ``--out`` file (a JSON report), refused like :func:`output_dir`."""
    import argparse

    if problem := output_problem(value, directory=False):
        raise argparse.ArgumentTypeError(problem)
    return value
