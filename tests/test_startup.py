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


# The same for `python -m <package>.<script>`: sys.argv[0] is "-m" while Python imports the script's packages, as it is
# under `python -m`; SIGINT the moment the script (or its package) first imports `module`.
INTERRUPT_SCRIPT_AT = """
import builtins, os, runpy, signal, sys
real_import, at = builtins.__import__, sys.argv[2]
def interrupt_at(name, *args, **kwargs):
    if name == at:
        builtins.__import__ = real_import
        os.kill(os.getpid(), signal.SIGINT)
    return real_import(name, *args, **kwargs)
builtins.__import__ = interrupt_at
script, sys.argv = sys.argv[1], ["-m", "--help"]
runpy.run_module(script, run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize(("script", "module", "name"), [
    ("analysis.bench_decode", "torch", "bench_decode"),
    ("analysis.paper_tables", "torch", "analysis"),  # a package: torch comes while -m imports it, before its __main__
    ("eval.compare", "numpy", "compare"),
    ("data_prep.bench_summarize", "httpx", "bench_summarize"),
])  # fmt: skip
def test_ctrl_c_while_a_script_imports_prints_one_line(script, module, name):
    """Ctrl-C while `python -m analysis.<script>` (or eval's, data_prep's) imported torch printed Python's traceback
    through that import; only the four entry points were quiet."""
    proc = subprocess.run(
        [sys.executable, "-c", INTERRUPT_SCRIPT_AT, script, module], cwd=REPO_ROOT, capture_output=True, text=True,
        timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert proc.returncode == 130 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip() == f"{name}: interrupted while starting; nothing was run"


def test_a_script_package_is_quiet_only_while_python_m_locates_a_script(monkeypatch):
    """Importing analysis (a test, a notebook) leaves Ctrl-C alone; run_script's main gets KeyboardInterrupt back."""
    from zoomr import startup
    from zoomr.script import run_script

    before = signal.getsignal(signal.SIGINT)
    try:
        startup.quiet_if_running_a_script("analysis")
        assert signal.getsignal(signal.SIGINT) is before
        monkeypatch.setattr(startup, "_package", None)
        monkeypatch.setattr(sys, "argv", ["-m"])
        startup.quiet_if_running_a_script("analysis")
        assert signal.getsignal(signal.SIGINT) is startup._stop_starting
        monkeypatch.setattr(sys, "argv", ["analysis/x.py"])

        def main():
            signal.raise_signal(signal.SIGINT)

        with pytest.raises(SystemExit) as stop:
            run_script(main)  # "x: interrupted", status 130
        assert stop.value.code == startup.INTERRUPTED
    finally:
        signal.signal(signal.SIGINT, before)


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


def _sigterm_here():
    """What SLURM does at a job's time limit (or `kill`). Under the default handler it would kill this test process."""
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, "SIGTERM would kill the command without a word"
    signal.raise_signal(signal.SIGTERM)


def test_sigterm_ends_a_script_with_one_line_and_status_143(monkeypatch, capsys):
    """SIGTERM (SLURM's time limit, preemption, `kill`) killed a script on the spot: no line, none of the cleanup Ctrl-C
    gets (a temporary file left beside its target). Now it is handled as Ctrl-C is, with the shell's 143."""
    from zoomr.script import run_script
    from zoomr.startup import TERMINATED

    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    monkeypatch.setattr(sys, "argv", ["/repo/analysis/bench_decode.py"])
    with pytest.raises(SystemExit) as stop:
        run_script(_sigterm_here)
    assert stop.value.code == TERMINATED == 143
    assert capsys.readouterr().err.strip() == "bench_decode: terminated (SIGTERM)"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back after the run


def test_sigterm_ends_an_entry_point_naming_what_a_rerun_resumes_from(tmp_path, monkeypatch):
    import contextlib
    import io
    import logging

    import zoomr.entry
    from data_prep.__main__ import main

    out = tmp_path / "pairs"
    monkeypatch.setattr(zoomr.entry, "check_run_settings", lambda cfg, here=True: _sigterm_here())
    monkeypatch.setattr(sys, "argv", ["data_prep", "+pipeline=summarize", f"pipeline.out_dir={out}",
                                      f"hydra.run.dir={tmp_path / 'run'}", "hydra/job_logging=none",
                                      "hydra/hydra_logging=none"])  # fmt: skip
    level = logging.root.level
    try:
        with pytest.raises(SystemExit) as stop, contextlib.redirect_stderr(io.StringIO()) as err:
            main()
    finally:
        logging.root.setLevel(level)
    assert stop.value.code == 143
    assert err.getvalue().strip() == (
        f"data_prep: terminated (SIGTERM); what was written to {out} is kept, and the same command resumes from it"
    )
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_sigterm_handler_installed_before_the_run_is_left_alone():
    """submitit ignores SIGTERM in its jobs (its own signal checkpoints and requeues them): that stays so."""
    from zoomr.startup import stop_on_sigterm

    seen = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        with stop_on_sigterm():
            signal.raise_signal(signal.SIGTERM)
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)
