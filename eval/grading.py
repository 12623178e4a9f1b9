"""Grading (METHODS.md, evaluation conventions; AbridgeKV §4).

A math sample is correct if its last ``\\boxed{}`` equals the gold after :func:`normalize`, else if
math-verify judges the text equivalent: ``verify(parse(gold), parse(text))``, gold first. A GPQA
sample is correct if the letter from :func:`extract_letter` (``Answer: X`` on its own line first)
is the gold letter.

math-verify bounds its own work with ``signal.alarm``, which only fires between Python bytecodes and
only in a main thread, so the math-verify stage runs in worker processes (forkserver or spawn)
with a per-sample wall-clock limit enforced by the parent: a worker past its deadline is killed and
replaced and the sample is graded incorrect (``method="timeout"``). The exact stage and GPQA
extraction are linear-time scans and run in the parent.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing as mp
import re
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class Grade:
    """``method``: exact | math_verify | letter | none (no answer / not equivalent) | timeout | error."""

    extracted: str | None
    correct: bool
    method: str
    seconds: float = 0.0


# ---------------------------------------------------------------------------------------------------
# Extraction and normalisation (linear time: safe on arbitrarily long, adversarial text)


def _match_braces(text: str, start: int) -> int | None:
    """Index just past the ``}`` closing the ``{`` at ``start``; None if unbalanced. Skips ``\\{``/``\\}``."""
    depth = 0
    i, n = start, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{…}`` / ``\\fbox{…}`` (or ``\\boxed 5``); None if absent or unclosed."""
    pos = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if pos < 0:
        return None
    i = pos + (6 if text.startswith("\\boxed", pos) else 5)
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] == "{":
        end = _match_braces(text, i)
        return None if end is None else text[i + 1 : end - 1]
    if i > pos + (6 if text.startswith("\\boxed", pos) else 5):  # "\boxed 5": up to the next space or $
        m = re.match(r"[^\s$]+", text[i:])
        return m.group(0) if m else None
    return None


_TEXT_WRAP = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")
_SPACES = re.compile(r"\\[,;:! ]|\\quad|\\qquad|~|\s+")
_DEGREES = re.compile(r"\^\s*\{?\\circ\}?|\\degree")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+")
_INTEGER = re.compile(r"[+-]?\d+")


def normalize(answer: str) -> str:
    """Canonical string for the exact stage: spacing, ``\\left``/``\\right``, ``\\dfrac``, ``\\text{}``,
    degrees, ``%``, dollar signs, a trailing period, thousands separators and leading zeros."""
    s = answer.strip().strip("$").strip()
    s = (
        s.replace("\\left", "")
        .replace("\\right", "")
        .replace("\\dfrac", "\\frac")
        .replace("\\tfrac", "\\frac")
    )
    s = _TEXT_WRAP.sub(r"\1", s)
    s = _DEGREES.sub("", s)
    s = s.replace("\\%", "").replace("%", "").replace("\\$", "")
    s = _SPACES.sub("", s)
    s = s.rstrip(".")
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    if _INTEGER.fullmatch(s):  # leading zeros and "+" dropped by string edits: no int() (4,300-digit limit)
        digits = s.lstrip("+-").lstrip("0") or "0"
        s = "-" + digits if s.startswith("-") and digits != "0" else digits
    return s


def exact_match(text: str, gold: str) -> tuple[str | None, bool]:
    boxed = last_boxed(text)
    return boxed, boxed is not None and normalize(boxed) == normalize(gold)


_LETTER_PATTERNS = [
    # "Answer: C", "**Answer:** (C)", "Final answer: $\boxed{C}$" at the start of a line (lighteval's anchor)
    re.compile(
        r"(?im)^[ \t>*_#]*(?:final[ \t]+)?answer[ \t*_]*[:：][ \t*_$]*\(?"
        r"(?:\\(?:text|textbf|mathbf|boxed)\{)?([A-D])\b"
    ),
    re.compile(r"(?i)\banswer[ \t]+is[ \t:]*\(?(?:\\(?:text|textbf|boxed)\{)?([A-D])\b"),
]


def extract_letter(text: str) -> str | None:
    """The chosen option letter: last anchored ``Answer: X`` line, else last ``\\boxed{X}``, else
    the last "answer is X"."""
    matches = _LETTER_PATTERNS[0].findall(text)
    if matches:
        return matches[-1].upper()
    boxed = last_boxed(text)
    if boxed is not None:
        inner = normalize(boxed).strip("()")
        if len(inner) == 1 and inner.upper() in "ABCD":
            return inner.upper()
    matches = _LETTER_PATTERNS[1].findall(text)
    return matches[-1].upper() if matches else None


def grade_letter(text: str, gold: str) -> Grade:
    letter = extract_letter(text)
    return Grade(
        letter, letter is not None and letter == gold.strip().upper(), "letter" if letter else "none"
    )


# ---------------------------------------------------------------------------------------------------
# math-verify stage (runs inside a worker process)


@functools.lru_cache(maxsize=4096)
def parse_gold(gold: str, inner_timeout: int) -> tuple:
    """math-verify's parse of a gold answer (``\\boxed{gold}``, else ``$gold$``), kept per worker process:
    a run grades every problem's samples against the same gold (sympy expressions are immutable)."""
    from math_verify import parse

    parsed = parse(f"\\boxed{{{gold}}}", parsing_timeout=inner_timeout)
    if not parsed:
        parsed = parse(f"${gold}$", parsing_timeout=inner_timeout)
    return tuple(parsed)


def math_verify_equal(text: str, gold: str, inner_timeout: int = 3) -> tuple[str | None, bool]:
    """``verify(parse(gold), parse(text))`` with math-verify's own signal timeouts (main thread only)."""
    from math_verify import parse, verify

    gold_parsed = list(parse_gold(gold, inner_timeout))
    pred_parsed = parse(text, parsing_timeout=inner_timeout)
    extracted = str(pred_parsed[-1]) if pred_parsed else None
    if not gold_parsed or not pred_parsed:
        return extracted, False
    return extracted, bool(verify(gold_parsed, pred_parsed, timeout_seconds=inner_timeout))


IDLE = -1.0


FLUSH_S = 0.05  # a worker sends its finished grades at least this often


def _worker_loop(
    conn: Any,
    inner_timeout: int,
    check: Callable[[str, str, int], tuple[str | None, bool]],
    status: Any,
    flush_s: float = FLUSH_S,
) -> None:
    """Serve batches of ``(index, text, gold)`` requests until the pipe closes or ``None`` arrives.

    ``status`` (shared memory, ``[index or IDLE, since]``) always says which sample runs since when, so the
    parent times every sample on its own without a message per sample; answers ``[(index, Grade), ...]``
    are sent every ``flush_s`` seconds, once half of a batch is done (so the parent can send the next batch
    while this one's second half runs, and the worker never waits for work) and before it waits for more.
    """
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # it logs whole texts on timeouts
    conn.send(READY)  # deadlines count from here: a slow start is not a slow sample
    done: list[tuple[int, Grade]] = []
    last_flush = time.monotonic()
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):
            return
        if batch is None:
            return
        for k, (index, text, gold) in enumerate(batch):
            t0 = time.perf_counter()
            status[1] = time.monotonic()  # the start first, then the index (the parent reads the index first)
            status[0] = index
            try:
                extracted, ok = check(text, gold, inner_timeout)
                result = Grade(extracted, ok, "math_verify" if ok else "none")
            except Exception as e:  # noqa: BLE001 - counted by the parent (Grader.errors), regraded on rerun
                result = Grade(None, False, "error")
                log.debug("math-verify failed: %s", e)
            status[1] = time.monotonic()
            status[0] = IDLE
            result.seconds = time.perf_counter() - t0
            done.append((index, result))
            now = time.monotonic()
            half_done = k == len(batch) // 2 - 1
            if now - last_flush >= flush_s or half_done or (k == len(batch) - 1 and not conn.poll()):
                conn.send(done)
                done, last_flush = [], now


def _worker_main(*args: Any) -> None:
    """A worker process: :func:`_worker_loop` deaf to Ctrl-C, which reaches the whole process group; the parent
    stops the pool (:meth:`Grader.close`). Each worker printed its own KeyboardInterrupt traceback under the run's
    one-line "interrupted"."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_loop(*args)


@dataclass
class _Worker:
    proc: Any
    conn: Any
    status: Any  # shared [index of the running sample or IDLE, since when (monotonic clock)]
    jobs: deque = field(default_factory=deque)  # indices sent and not answered yet, in order
    sent_at: float = 0.0  # when the parent last sent a batch

    def running(self) -> tuple[int | None, float]:
        """The sample the worker is grading and since when (None: between samples, since the later of
        its last sample and the last batch sent, so a worker that is sent work and never starts it times out)."""
        index = self.status[0]  # the index first: the worker writes the time before the index
        since = self.status[1]
        return (None, max(since, self.sent_at)) if index == IDLE else (int(index), since)


# (text, gold) or (text, gold, check): check(text, gold) -> Grade is a task's own answer check
Sample = tuple[str, str] | tuple[str, str, Callable[[str, str], "Grade"] | None]

READY = "ready"
PRELOAD = ["math_verify", "sympy", "eval.grading", "eval.grading_warm"]  # forkserver: imported (and warmed) once
START_TIMEOUT_S = 120.0  # a worker that has not started by then (a machine thrashing) is a broken pool


class GraderBroken(RuntimeError):
    """The math-verify workers keep dying before they grade anything."""


class Grader:
    """Grades batches of samples; a pool of math-verify workers with a per-sample wall-clock limit.

    Workers start once (lazily, or with :meth:`start`) and are reused for every call; each worker is
    kept ``depth`` samples ahead, sent in batches, and answers sample by sample, so every sample still
    has its own deadline: past it the worker is killed and replaced, the sample is graded ``timeout``
    and the samples queued behind it go to the next free worker. Counters (:meth:`counts`): timeouts,
    errors (math-verify raised), worker deaths (a worker died mid-sample; graded ``error``), restarts.
    ``GraderBroken`` is raised when the workers die ``2 x workers + 1`` times in a row without an answer
    (e.g. a grading script without an ``if __name__ == "__main__":`` guard).
    """

    def __init__(
        self,
        workers: int = 2,
        timeout_s: float = 10.0,
        start_method: str = "forkserver",
        math_verify: bool = True,
        strip_reasoning: bool = False,
        exact_first: bool = True,
        check: Callable[[str, str, int], tuple[str | None, bool]] = math_verify_equal,
        depth: int = 8,
    ):
        check_grading_settings(workers, timeout_s, start_method)
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.n_workers = workers
        self.timeout_s = timeout_s
        self.inner_timeout = max(1, int(timeout_s / 3))
        self.math_verify = math_verify
        self.strip_reasoning = strip_reasoning
        self.exact_first = exact_first  # False: every math sample goes through math-verify (tests, benchmarks)
        self.check = check  # the worker-side equivalence test (a module-level function: it is pickled by name)
        self.depth = depth
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            self._ctx.set_forkserver_preload(PRELOAD)
        self._workers: list[_Worker] = []
        self.graded = 0  # samples graded (any stage)
        self.timeouts = 0
        self.errors = 0
        self.deaths = 0
        self.restarts = 0
        self._deaths_in_a_row = 0
        self._last_exitcode: int | None = None

    def counts(self) -> dict[str, int]:
        """What ``metrics.json`` reports under ``grading``: samples graded and what went wrong."""
        return {
            "graded": self.graded,
            "timeouts": self.timeouts,
            "errors": self.errors,
            "worker_deaths": self.deaths,
            "worker_restarts": self.restarts,
        }

    @property
    def failures(self) -> int:
        """Samples whose grading did not finish (graded ``error``: math-verify raised or the worker died)."""
        return self.errors + self.deaths

    # -- pool management
    def start(self, n: int | None = None) -> Grader:
        """Start the workers now (e.g. while the model loads) instead of on the first math-verify sample."""
        while len(self._workers) < min(self.n_workers, n or self.n_workers):
            self._workers.append(self._spawn())
        return self

    def _spawn(self) -> _Worker:
        """A started worker that has said it is ready (one that dies on start counts towards GraderBroken)."""
        while True:
            parent, child = self._ctx.Pipe()
            status = self._ctx.Array("d", [IDLE, 0.0], lock=False)
            proc = self._ctx.Process(
                target=_worker_main, args=(child, self.inner_timeout, self.check, status), daemon=True
            )
            proc.start()
            child.close()
            w = _Worker(proc, parent, status, sent_at=time.monotonic())
            try:
                if parent.poll(START_TIMEOUT_S) and parent.recv() == READY:
                    return w
            except (EOFError, OSError):
                pass
            self._kill(w)
            self._count_death_in_a_row()

    def _count_death_in_a_row(self) -> None:
        self._deaths_in_a_row += 1
        if self._deaths_in_a_row > 2 * self.n_workers:
            raise GraderBroken(
                f"the math-verify workers died {self._deaths_in_a_row} times in a row without grading a sample "
                f"(last exit code {self._last_exitcode}); a grading script must guard its entry with "
                '`if __name__ == "__main__":`'
            )

    def _kill(self, w: _Worker) -> None:
        w.proc.kill()
        w.proc.join(5)
        self._last_exitcode = w.proc.exitcode
        w.conn.close()

    def close(self) -> None:
        for w in self._workers:
            with contextlib.suppress(OSError):
                w.conn.send(None)
        for w in self._workers:
            w.proc.join(2)
            if w.proc.is_alive():
                w.proc.kill()
                w.proc.join(2)
            w.conn.close()
        self._workers = []

    def __enter__(self) -> Grader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- grading
    def prepare(self, text: str) -> str:
        if self.strip_reasoning:
            from eval.prompts import strip_reasoning

            return strip_reasoning(text)
        return text

    def grade(self, samples: Sequence[Sample], on_result: Callable[[int, Grade], None] | None = None) -> list[Grade]:
        """Grade ``(text, gold)`` pairs or ``(text, gold, check)`` triples; results in input order.

        ``check(text, gold) -> Grade`` is a task's own answer check (GPQA's letter, the testbed's exact
        answer; :attr:`eval.tasks.Task.answer_check`); without one (or None) a sample goes through the math
        stages: the exact ``\\boxed{}`` match, then math-verify in the workers. ``on_result(i, grade)`` is
        called as each sample finishes (in completion order).
        """
        results: list[Grade | None] = [None] * len(samples)
        pending: deque[int] = deque()

        def done(i: int, g: Grade) -> None:
            results[i] = g
            self.graded += 1
            if on_result:
                on_result(i, g)

        prepared = [(self.prepare(text), gold) for text, gold, *_ in samples]
        for i, ((text, gold), sample) in enumerate(zip(prepared, samples)):
            t0 = time.perf_counter()
            check = sample[2] if len(sample) > 2 else None
            if check is not None:
                g = check(text, gold)
            else:
                boxed, ok = exact_match(text, gold) if self.exact_first else (None, False)
                if not ok and self.math_verify:
                    pending.append(i)
                    continue
                g = Grade(boxed, ok, "exact" if ok else "none")
            g.seconds = time.perf_counter() - t0
            done(i, g)
        if pending:
            self._run_workers(prepared, pending, done)
        return results  # type: ignore[return-value]

    def _send(self, w: _Worker, samples: Sequence[tuple[str, str]], pending: deque[int], done) -> None:
        """Top ``w`` up to ``depth`` queued samples with one message, once half of its queue is done."""
        # smaller batches as the work runs out, so no worker sits on a long queue while another idles
        n = min(self.depth - len(w.jobs), max(1, -(-len(pending) // (2 * self.n_workers))))
        if not pending or len(w.jobs) > self.depth // 2:
            return
        batch = [pending.popleft() for _ in range(n)]
        try:
            w.conn.send([(i, samples[i][0], samples[i][1]) for i in batch])
        except OSError:  # the worker died: this batch goes back to pending, its queue is handled in _died
            pending.extendleft(reversed(batch))
            self._died(w, samples, pending, done)
            return
        w.sent_at = time.monotonic()
        w.jobs.extend(batch)

    def _died(self, w: _Worker, samples, pending: deque[int], done: Callable) -> None:
        """A worker died: the sample it was grading is graded ``error``, the rest of its queue is requeued."""
        index, started = w.running()
        self._kill(w)
        self._requeue(w, pending, index)
        self._count_death_in_a_row()
        self._replace(w, killed=True)
        if index is not None:
            self.deaths += 1
            done(index, Grade(last_boxed(samples[index][0]), False, "error", time.monotonic() - started))

    def _requeue(self, w: _Worker, pending: deque[int], running: int | None) -> None:
        """Put a killed worker's unanswered samples (its answers not yet sent included) back in front."""
        pending.extendleft(reversed([i for i in w.jobs if i != running]))
        w.jobs.clear()

    def _receive(self, w: _Worker, samples, done: Callable) -> bool:
        """Take one message of answers from ``w``; False if the worker died."""
        try:
            answers = w.conn.recv()
        except (EOFError, OSError):  # the worker died (e.g. recursion overflow in C code)
            return False
        self._deaths_in_a_row = 0
        for index, grade in answers:
            w.jobs.remove(index)
            self.errors += grade.method == "error"
            boxed = last_boxed(samples[index][0])  # the boxed answer is the more readable record
            grade.extracted = boxed if boxed is not None else grade.extracted
            done(index, grade)
        return True

    def _run_workers(
        self, samples: Sequence[tuple[str, str]], pending: deque[int], done: Callable
    ) -> None:
        self.start(len(pending))
        while pending or any(w.jobs for w in self._workers):
            for w in self._workers:
                self._send(w, samples, pending, done)
            busy = {w.conn: w for w in self._workers if w.jobs}
            if not busy:
                continue
            next_deadline = min(w.running()[1] + self.timeout_s for w in busy.values())
            for conn in wait(list(busy), timeout=min(1.0, max(0.0, next_deadline - time.monotonic()))):
                if not self._receive(busy[conn], samples, done):
                    self._died(busy[conn], samples, pending, done)
            now = time.monotonic()
            for w in busy.values():
                index, started = w.running()
                if w.jobs and now - started >= self.timeout_s:
                    if index is None:  # answers sent but not read yet, or a silent worker: read first
                        if w.conn.poll(0):
                            continue
                        index = w.jobs[0]
                    self._kill(w)
                    self.timeouts += 1
                    self._requeue(w, pending, index)
                    self._replace(w, killed=True)
                    done(index, Grade(last_boxed(samples[index][0]), False, "timeout", now - started))

    def _replace(self, w: _Worker, killed: bool = False) -> None:
        """Kill a stuck or dead worker and start a fresh one in its slot."""
        if not killed:
            self._kill(w)
        fresh = self._spawn()
        w.proc, w.conn, w.status, w.sent_at = fresh.proc, fresh.conn, fresh.status, fresh.sent_at
        self.restarts += 1


def check_grading_settings(workers: int, timeout_s: float, start_method: str, max_error_rate: float = 0.0) -> None:
    """The grader's settings, checked before any state is written (``eval`` validates them up front)."""
    if workers < 1:
        raise ValueError(f"grading.workers must be >= 1, got {workers}")
    if not 0 < timeout_s < float("inf"):  # inf was an OverflowError traceback after the fingerprint
        raise ValueError(f"grading.timeout_s must be > 0 and finite, got {timeout_s}")
    if start_method not in ("forkserver", "spawn"):
        raise ValueError(f"grading.start_method must be forkserver|spawn, got {start_method!r}")
    if not 0.0 <= max_error_rate <= 1.0:
        raise ValueError(f"grading.max_error_rate must lie in [0, 1], got {max_error_rate}")
