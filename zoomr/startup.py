"""Ctrl-C while an entry point starts (importing torch and transformers, Hydra composing the config).

Python's own handler would print a traceback through whichever import it interrupted. Each ``python -m <entry>``
installs :func:`quiet_while_starting` first thing when run as a command (stdlib only here, so it is in place before
the heavy imports); :func:`zoomr.entry.hydra_entry` calls :func:`started` when the run itself begins, from which
on a Ctrl-C is a ``KeyboardInterrupt`` the entry point reports with the directory a rerun resumes from. The
scripts (``python -m analysis.<script>``, ``eval.<script>``, ``data_prep.<script>``) get the same from their
package's ``__init__`` (:func:`quiet_if_running_a_script`), and :func:`zoomr.script.run_script` calls
:func:`started`.
"""

from __future__ import annotations

import os
import signal
import sys

INTERRUPTED = 130  # 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C


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
