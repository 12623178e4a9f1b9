"""Range checks of numeric settings, run in a schema's ``__post_init__`` (before any state is written).

``check_fields(obj, "method.optim", learning_rate=POSITIVE, adam_beta1=BETA)`` raises one ``ValueError`` naming
every field whose value is not a finite number in its range (``None`` passes: an optional field left unset).
Without it a negative learning rate, a zero batch size or a NaN weight decay reaches torch or the ``Trainer``
after the run directory, the tokenizer and the data exist, or trains silently with a meaningless schedule.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

Rule = tuple[Callable[[float], bool], str]


class SettingsError(ValueError):
    """A setting the user gave is impossible (raised through :func:`zoomr.schemas.to_dataclass`); entry points
    print its message instead of a traceback. A ``ValueError``, so library callers catch it as before."""

POSITIVE: Rule = (lambda v: v > 0, "> 0")
NON_NEGATIVE: Rule = (lambda v: v >= 0, ">= 0")
AT_LEAST_ONE: Rule = (lambda v: v >= 1, ">= 1")
FRACTION: Rule = (lambda v: 0 <= v <= 1, "in [0, 1]")
BETA: Rule = (lambda v: 0 <= v < 1, "in [0, 1)")  # Adam's betas, a dropout probability
FINITE: Rule = (lambda v: True, "a finite number")  # any sign (check_fields refuses NaN and infinities first)


def is_integer(value: Any) -> bool:
    """An ``int`` that is not a ``bool`` (JSON ``true`` would pass as 1; a float would be truncated)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_finite_number(value: Any) -> bool:
    """An ``int`` or ``float`` (not a ``bool``) that is neither NaN nor infinite."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def type_problem(name: str, value: Any, hint: Any) -> str | None:
    """``"<name>=<value> (must be an int)"`` when ``value`` lacks the type of a scalar field ``hint`` (``int``,
    ``float``, ``bool``, ``str``; an int is a float, None passes, other hints are not checked here); else None.
    Hydra types a schema's own fields, but not a dict node (``benchmark.options``) or a dataclass built in code."""
    if value is None or hint not in (int, float, bool, str):
        return None
    if hint in (int, float):
        ok = is_integer(value) or (hint is float and isinstance(value, float))
    else:
        ok = isinstance(value, hint)
    return None if ok else f"{name}={value!r} (must be {'an' if hint is int else 'a'} {hint.__name__})"


def check_types(obj: Any, prefix: str) -> None:
    """Raise ``ValueError`` naming each scalar field of the dataclass ``obj`` whose value lacks its annotated type."""
    import dataclasses
    import typing

    from zoomr.schemas import optional_of

    hints = typing.get_type_hints(type(obj))
    wrong = [problem for f in dataclasses.fields(obj)
             if (problem := type_problem(f"{prefix}.{f.name}", getattr(obj, f.name), optional_of(hints.get(f.name))))]
    if wrong:
        raise ValueError(f"{type(obj).__name__}: " + "; ".join(wrong))


def check_fields(obj: Any, prefix: str, **rules: Rule) -> None:
    """Raise ``ValueError`` naming each ``prefix.<field>=<value>`` of ``obj`` that breaks its rule."""
    bad = []
    for name, (ok, text) in rules.items():
        value = getattr(obj, name)
        values = value if isinstance(value, list | tuple) else [value]
        for v in values:
            if v is None:
                continue
            number = isinstance(v, int | float) and not isinstance(v, bool)
            if not (number and math.isfinite(v) and ok(v)):
                bad.append(f"{prefix}.{name}={value!r} (must be {'each ' if value is not v else ''}{text})")
                break
    if bad:
        raise ValueError(f"{type(obj).__name__}: " + "; ".join(bad))
