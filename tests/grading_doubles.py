"""Worker-side test doubles for the grader (``Grader(check=...)``), in a module that imports nothing heavy:
a worker unpickles its check by importing the module that defines it."""

from __future__ import annotations

import os
import time


def raises_on_boom(text: str, gold: str, inner_timeout: int):
    if text == "boom":
        raise RuntimeError("math-verify blew up")
    return text, text == gold


def always_raises(text: str, gold: str, inner_timeout: int):
    raise RuntimeError("broken grader")


def dies(text: str, gold: str, inner_timeout: int):
    os._exit(7)


def sleeps(text: str, gold: str, inner_timeout: int):
    time.sleep(float(text))
    return text, True
