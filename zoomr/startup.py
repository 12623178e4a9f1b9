"""Ctrl-C while an entry point starts (importing torch and transformers, Hydra composing the config).

Python's own handler would print a traceback through whichever import it interrupted. Each ``python -m <entry>``
installs :func:`quiet_while_starting` first thing when run as a command (stdlib only here, so it is in place before
the heavy imports); :func:`zoomr.entry.hydra_entry` calls :func:`started` when the run itself begins, from which
on a Ctrl-C is a ``KeyboardInterrupt`` the entry point reports with the directory a rerun resumes from.
"""

from __future__ import annotations

import os
import signal
import sys

INTERRUPTED = 130  # 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C


def _stop_starting(signum: int, frame: object) -> None:
    # os._exit, not an exception: one raised here can land in a __del__ (a regex's, mid-import), where Python
    # ignores it and the command runs on. Nothing needs cleaning up: the run has not begun.
    name = getattr(sys.modules.get("__main__"), "__package__", None) or "command"
    print(f"\n{name}: interrupted while starting; nothing was run", file=sys.stderr, flush=True)
    os._exit(INTERRUPTED)


def quiet_while_starting() -> None:
    """Until :func:`started`: Ctrl-C prints one line and exits with status 130, no traceback."""
    signal.signal(signal.SIGINT, _stop_starting)


def started() -> None:
    """Ctrl-C raises ``KeyboardInterrupt`` again (only where :func:`quiet_while_starting` replaced it)."""
    if signal.getsignal(signal.SIGINT) is _stop_starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)
