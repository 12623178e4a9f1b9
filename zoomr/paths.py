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
