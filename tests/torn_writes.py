"""A kill while a file is written, for the tests of outputs written whole (temporary name, then rename)."""

from __future__ import annotations

import builtins
import contextlib
import io
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def writes_torn(fragment: str) -> Iterator[None]:
    """Inside, a file opened for writing whose path holds ``fragment`` takes half of its first write, then closes and
    raises ``KeyboardInterrupt`` (the kill); every other file opens as usual."""
    real_open = io.open

    class Torn:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            self.f.write(text[: len(text) // 2])
            self.f.close()
            raise KeyboardInterrupt

    def tearing_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        return Torn(f) if "w" in mode and fragment in str(file) else f

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(io, "open", tearing_open)
        patch.setattr(builtins, "open", tearing_open)
        yield
