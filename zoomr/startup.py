"""Ctrl-C while an entry point starts (importing torch and transformers, Hydra composing the config).

Python's own handler would print a traceback through whichever import it interrupted. Each ``python -m <entry>``
installs :func:`quiet_while_starting` first thing when run as a command (stdlib only here, so it is in place before
the heavy imports); :func:`zoomr.entry.hydra_entry` calls :func:`started` when the run itself begins, from which
on a Ctrl-C is a ``KeyboardInterrupt`` the entry point reports with the directory a rerun resumes from. The
scripts (``python -m analysis.<script>``, ``eval.<script>``, ``data_prep.<script>``) get the same from their
package's ``__init__`` (:func:`quiet_if_running_a_script`), and :func:`zoomr.script.run_script` calls
:func:`started`.

SIGTERM (``kill``, SLURM at a job's time limit or on preemption, torchrun stopping its workers) is handled the same
way while the run works (:func:`stop_on_sigterm`): :class:`Terminated`, a ``KeyboardInterrupt``, reported in one line
with status 143.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

INTERRUPTED = 130  # 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C
TERMINATED = 143  # 128 + SIGTERM: what a shell reports for a command stopped by `kill` (SLURM's time limit)


_package: str | None = None  # the package whose script ``python -m`` is locating (quiet_if_running_a_script)


def _command_name() -> str:
    """The command's name as :func:`zoomr.script.run_script` gives it: ``train``, ``bench_decode``, ``paper_tables``."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is None:  # python -m is still importing the script's packages: the script is not known yet
        return getattr(main, "__package__", None) or _package or "command"
    parts = spec.name.split(".")
    return parts[-2] if parts[-1] == "__main__" and len(parts) > 1 else parts[-1]


def _stop_starting(signum: int, frame: object) -> None:
    # os._exit, not an exception: one raised here can land in a __del__ (a regex's, mid-import), where Python
    # ignores it and the command runs on. Nothing needs cleaning up: the run has not begun.
    name = _command_name()
    print(f"\n{name}: interrupted while starting; nothing was run", file=sys.stderr, flush=True)
    os._exit(INTERRUPTED)


def quiet_while_starting() -> None:
    """Until :func:`started`: Ctrl-C prints one line and exits with status 130, no traceback."""
    signal.signal(signal.SIGINT, _stop_starting)


def quiet_if_running_a_script(package: str) -> None:
    """For a package of scripts (its ``__init__``): :func:`quiet_while_starting` when Python imports it to run one of
    its modules as ``python -m <package>.<script>``, before that script's own imports. ``sys.argv[0]`` is ``"-m"``
    only then (while ``-m`` locates the module, the documented behaviour); an ``import`` of the package changes
    nothing."""
    global _package
    if getattr(sys, "argv", [])[:1] == ["-m"]:
        _package = _package or package  # the script's own package comes first (it may import another)
        quiet_while_starting()


def started() -> None:
    """Ctrl-C raises ``KeyboardInterrupt`` again (only where :func:`quiet_while_starting` replaced it)."""
    if signal.getsignal(signal.SIGINT) is _stop_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)


class Terminated(KeyboardInterrupt):
    """SIGTERM while a run works: a ``KeyboardInterrupt``, so everything that cleans up after Ctrl-C (removing a
    temporary file, stopping the grading workers, the one-line report) does so after a ``kill`` too."""


def _terminate(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM while this one is reported ends it at once
    raise Terminated


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """While the run works, SIGTERM raises :class:`Terminated` where Python's default killed the process on the spot:
    no line, none of the cleanup a Ctrl-C gets. Only over the default (a handler someone else installed, e.g.
    submitit's, which ignores SIGTERM until its own signal checkpoints the job, is left alone), in the main thread,
    and put back afterwards."""
    mine = threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    if mine:
        signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        if mine and signal.getsignal(signal.SIGTERM) is _terminate:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
