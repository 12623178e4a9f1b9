"""The evaluation loop: problems x samples -> generate in batches -> grade -> append rows -> metrics.

Finished (problem, sample) keys in the run directory are skipped, so rerunning a killed run resumes
it; every row is appended and flushed as soon as its sample is graded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

from eval.benchmarks import Problem
from eval.generation import GenerateFn, Generation, sample_seed
from eval.grading import Grade, Grader
from eval.results import Key, ResultStore, is_grading_error

AnswerCheck = Callable[[str, str], Grade]  # a task's own check of one (text, gold)


def work_items(problems: list[Problem], n_samples: int, done: set[Key] | dict) -> list[tuple[Problem, int]]:
    """(problem, sample index) pairs still to do, problem-major order."""
    return [(p, s) for p in problems for s in range(n_samples) if (p.id, s) not in done]


def make_row(
    benchmark: str,
    problem: Problem,
    sample: int,
    gen: Generation,
    grade: Grade,
    seconds: float,
    save_ids: bool,
) -> dict[str, Any]:
    row = {
        "benchmark": benchmark,
        "competition": problem.competition,
        "problem_id": problem.id,
        "sample": sample,
        "gold": problem.answer,
        "text": gen.text,
        "n_tokens": gen.n_tokens,
        "prompt_tokens": gen.prompt_tokens,
        "truncated": gen.truncated,
        "extracted": grade.extracted,
        "correct": grade.correct,
        "grade_method": grade.method,
        "grade_seconds": round(grade.seconds, 4),
        "wall_seconds": round(seconds, 3),
        "kv": gen.kv,
    }
    if save_ids:
        row["token_ids"] = list(gen.token_ids)
    if gen.decode:
        row["decode"] = gen.decode
    return row


def regrade_failed(
    problems: list[Problem], grader: Grader, store: ResultStore, scope: list[Key], check: AnswerCheck | None = None
) -> int:
    """Grade again the rows whose grading failed in an earlier run (a worker died): their text is kept,
    so nothing is generated again; the new row replaces the failed one (:meth:`ResultStore.load`)."""
    by_id = {p.id: p for p in problems}
    failed = [store.rows[k] for k in scope if k in store.rows and is_grading_error(store.rows[k])]
    if not failed:
        return 0
    grades = grader.grade([(r["text"], by_id[r["problem_id"]].answer, check) for r in failed])
    for row, grade in zip(failed, grades):
        store.append(
            {**row, "extracted": grade.extracted, "correct": grade.correct, "grade_method": grade.method,
             "grade_seconds": round(grade.seconds, 4)}
        )  # fmt: skip
    return len(failed)


def evaluate(
    problems: list[Problem],
    generate: GenerateFn,
    grader: Grader,
    store: ResultStore,
    render: Callable[[Problem], str],
    *,
    benchmark: str,
    n_samples: int,
    batch_size: int,
    seed: int,
    save_token_ids: bool = False,
    progress: bool = True,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    script: Callable[[Problem], list[int | None]] | None = None,
    details: Callable[[Problem, Generation], dict[str, Any]] | None = None,
    grade: Callable[[Problem, Generation], Grade] | None = None,
    check: AnswerCheck | None = None,
) -> list[dict[str, Any]]:
    """Run every missing (problem, sample) and return the rows of all keys in scope, in order.

    ``script(problem)``: the environment's tokens for the generator (``zoomr.engine.generate(script=…)``;
    the testbed's facts). ``details(problem, generation)``: extra fields for the row (the testbed's
    per-fact recall). ``grade(problem, generation)``: the task's own grader in place of ``grader``
    (scored tasks, :mod:`eval.tasks`). ``check(text, gold)``: the task's answer check inside ``grader``
    (None: the grader's math stages). A generation's ``decode`` details (the generator's ``inspect``
    hook, :func:`eval.generation.engine_generator`) go into its row under ``decode``.
    """
    if n_samples < 1 or batch_size < 1:
        raise ValueError(f"n_samples and batch_size must be >= 1, got {n_samples}, {batch_size}")
    store.load()
    todo = work_items(problems, n_samples, store.rows)
    scope = [(p.id, s) for p in problems for s in range(n_samples)]
    regrade_failed(problems, grader, store, scope, check)
    done_in_scope = [store.rows[k] for k in scope if k in store.rows]
    correct, graded = sum(r["correct"] for r in done_in_scope), len(done_in_scope)
    if graded:  # a resumed run: say what it skips
        tqdm.write(f"resuming {store.path}: {graded} of {len(scope)} samples already done, skipped; {len(todo)} to run")
    bar = tqdm(  # named by the run's directory (its run_name: the arm), several arms may run one after another
        total=len(scope), initial=graded, desc=f"eval {benchmark} [{store.path.parent.name}]", disable=not progress,
        dynamic_ncols=True,
    )
    # the last problem's prompt, rendered once for its samples (consecutive: problem-major order); a dict of every
    # prompt (setdefault, which renders its argument each time) rendered one per sample and kept them all
    rendered: dict[str, str] = {}
    for start in range(0, len(todo), batch_size):
        batch = todo[start : start + batch_size]
        texts = []
        for p, _ in batch:
            if p.id not in rendered:
                rendered = {p.id: render(p)}
            texts.append(rendered[p.id])
        seeds = [sample_seed(seed, p.id, s) for p, s in batch]
        t0 = time.perf_counter()
        gens = generate(texts, seeds, [script(p) for p, _ in batch]) if script else generate(texts, seeds)
        seconds = time.perf_counter() - t0
        if len(gens) != len(batch):
            raise RuntimeError(f"generator returned {len(gens)} samples for a batch of {len(batch)}")

        def write(i: int, grade: Grade, batch=batch, gens=gens, seconds=seconds) -> None:
            nonlocal correct, graded
            problem, sample = batch[i]
            row = make_row(benchmark, problem, sample, gens[i], grade, seconds, save_token_ids)
            if details:
                row.update(details(problem, gens[i]))
            store.append(row)
            correct += row["correct"]
            graded += 1
            bar.update(1)
            bar.set_postfix(acc=f"{100 * correct / graded:.1f}%", tokens=gens[i].n_tokens)
            if on_row:
                on_row(row)

        if grade is not None:
            for i, ((p, _), g) in enumerate(zip(batch, gens)):
                write(i, grade(p, g))
        else:
            grader.grade([(g.text, p.answer, check) for (p, _), g in zip(batch, gens)], on_result=write)
    bar.close()
    return [store.rows[k] for k in scope]
