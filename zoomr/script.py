"""How every command-line script ends on a bad input: the message alone, exit status 1, no traceback.

``python -m <package>.<script>`` runs ``run_script(main)``. A missing input (:class:`zoomr.paths.MissingInput`), a
malformed one (:class:`zoomr.jsonl.BadRowError`) or an impossible setting (:class:`zoomr.schemas.checks.SettingsError`)
is a problem of what the user gave, and an output a full disk or a read-only file system cannot take
(:class:`zoomr.paths.OutputUnwritable`) one of where it goes, so each is printed as a sentence naming it; anything
else is a bug and keeps its traceback. Ctrl-C ends with one line and exit status 130 (the shell's code for it), not a traceback through torch;
SIGTERM (``kill``, SLURM's time limit) the same way with status 143 (:func:`zoomr.startup.stop_on_sigterm`).
The Hydra entry points (:func:`zoomr.entry.hydra_entry`) do the same.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zoomr.jsonl import BadRowError
from zoomr.paths import MissingInput, OutputUnwritable
from zoomr.schemas.checks import SettingsError
from zoomr.startup import INTERRUPTED, TERMINATED, Terminated, started, stop_on_sigterm

USER_ERRORS = (MissingInput, BadRowError, SettingsError, OutputUnwritable)  # what the user gave is wrong, or where
# its output goes cannot take it: printed, not a traceback


def interrupted(name: str, resumes_from: str | None = None, stop: BaseException | None = None) -> SystemExit:
    """Ctrl-C: print one line (where the finished work is when a rerun resumes from it) and exit with status 130;
    SIGTERM (``stop`` a :class:`~zoomr.startup.Terminated`): the same line, ``terminated``, and status 143."""
    kept = f"; what was written to {resumes_from} is kept, and the same command resumes from it" if resumes_from else ""
    how, code = ("terminated (SIGTERM)", TERMINATED) if isinstance(stop, Terminated) else ("interrupted", INTERRUPTED)
    print(f"\n{name}: {how}{kept}", file=sys.stderr)  # on a line of its own after a progress bar
    return SystemExit(code)


def user_error_message(error: BaseException) -> str | None:
    """The sentence to print for a problem in what the user gave (None: a bug, keep the traceback)."""
    if isinstance(error, SettingsError):
        return f"invalid settings: {error}"
    if isinstance(error, MissingInput | BadRowError | OutputUnwritable):
        return str(error)
    return None


def run_script(main: Callable[[], Any]) -> None:
    """Run a script's ``main()``; its exit code when it returns one (an ``int``)."""
    script = Path(sys.argv[0])
    name = script.parent.name if script.stem == "__main__" else script.stem  # python -m <package>: its name
    started()  # Ctrl-C is a KeyboardInterrupt again (its package's __init__ made it one line while importing)
    try:
        with stop_on_sigterm():
            code = main()
    except USER_ERRORS as e:
        raise SystemExit(f"{name}: {user_error_message(e)}") from None
    except KeyboardInterrupt as e:
        raise interrupted(name, stop=e) from None
    if isinstance(code, int) and not isinstance(code, bool):
        raise SystemExit(code)
