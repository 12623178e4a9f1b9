"""Ctrl-C while an entry point imports torch: one line and status 130, not a traceback (zoomr.startup)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# Runs `python -m <entry>` and sends it SIGINT the moment it first imports torch: deterministic, unlike a timer.
INTERRUPT_AT_TORCH = """
import builtins, os, runpy, signal, sys
real_import = builtins.__import__
def interrupt_at_torch(name, *args, **kwargs):
    if name == "torch":
        builtins.__import__ = real_import
        os.kill(os.getpid(), signal.SIGINT)
    return real_import(name, *args, **kwargs)
builtins.__import__ = interrupt_at_torch
sys.argv = [sys.argv[1], "--help"]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("entry", ["train", "eval", "data_prep", "analysis"])
def test_ctrl_c_while_importing_prints_one_line(entry):
    proc = subprocess.run(
        [sys.executable, "-c", INTERRUPT_AT_TORCH, entry], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"}, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip() == f"{entry}: interrupted while starting; nothing was run"


def test_started_restores_only_its_own_handler():
    from zoomr import startup

    before = signal.getsignal(signal.SIGINT)
    try:
        startup.quiet_while_starting()
        assert signal.getsignal(signal.SIGINT) is not before
        startup.started()
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)

        def own(signum, frame):
            raise RuntimeError("the caller's own handler")

        signal.signal(signal.SIGINT, own)
        startup.started()  # a handler it did not install (a test runner's, a user's) is left alone
        assert signal.getsignal(signal.SIGINT) is own
    finally:
        signal.signal(signal.SIGINT, before)
