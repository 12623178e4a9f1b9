"""How every command-line script ends on a bad input: the message alone, exit status 1, no traceback.

``python -m <package>.<script>`` runs ``run_script(main)``. A missing input (:class:`zoomr.paths.MissingInput`), a
malformed one (:class:`zoomr.jsonl.BadRowError`) or an impossible setting (:class:`zoomr.schemas.checks.SettingsError`)
is a problem of what the user gave, so it is printed as a sentence naming it; anything else is a bug and keeps its
traceback. Ctrl-C ends with one line and exit status 130 (the shell's code for it), not a traceback through torch.
The Hydra entry points (:func:`zoomr.entry.hydra_entry`) do the same.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from zoomr.jsonl import BadRowError
from zoomr.paths import MissingInput
from zoomr.schemas.checks import SettingsError
from zoomr.startup import INTERRUPTED, started

USER_ERRORS = (MissingInput, BadRowError, SettingsError)  # what the user gave is wrong: printed, not a traceback


def interrupted(name: str, resumes_from: str | None = None) -> SystemExit:
    """Ctrl-C: print one line (where the finished work is when a rerun resumes from it) and exit with status 130."""
    kept = f"; what was written to {resumes_from} is kept, and the same command resumes from it" if resumes_from else ""
    print(f"\n{name}: interrupted{kept}", file=sys.stderr)  # on a line of its own after a progress bar
    return SystemExit(INTERRUPTED)


def user_error_message(error: BaseException) -> str | None:
    """The sentence to print for a problem in what the user gave (None: a bug, keep the traceback)."""
    if isinstance(error, SettingsError):
        return f"invalid settings: {error}"
    if isinstance(error, MissingInput | BadRowError):
        return str(error)
    return None


def run_script(main: Callable[[], Any]) -> None:
    """Run a script's ``main()``; its exit code when it returns one (an ``int``)."""
    script = Path(sys.argv[0])
    name = script.parent.name if script.stem == "__main__" else script.stem  # python -m <package>: its name
    started()  # Ctrl-C is a KeyboardInterrupt again (its package's __init__ made it one line while importing)
    try:
        code = main()
    except USER_ERRORS as e:
        raise SystemExit(f"{name}: {user_error_message(e)}") from None
    except KeyboardInterrupt:
        raise interrupted(name) from None
    if isinstance(code, int) and not isinstance(code, bool):
        raise SystemExit(code)
