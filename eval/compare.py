"""``python -m eval.compare RUN_DIR [RUN_DIR ...]``: arms side by side in the layout of AbridgeKV Table 1.

One row per arm (the first arm is the reference), per benchmark its accuracy (avg@k, %) and the
paired difference to the reference in points with its 95% paired-bootstrap interval, then KV/512,
mean resident KV, truncation % and mean generated tokens on the first benchmark. Run directories of
one arm on several benchmarks (same model and run_name) share a row. Arms must cover the same problems of a
benchmark; anything else is an error that names the differing problems. Arms must also have run with the
same settings: every run directory's ``fingerprint.json`` (sampling, token cap, prompt, grading, benchmark
options) is diffed against the reference's, model and method aside (those are what the arms compare); a
difference is refused, naming each field, unless ``--allow-different-settings`` (then the table says so).

Writes ``table.md``, ``table.csv`` and ``table.json`` to ``--out`` (default ``runs/compare/<arm>_vs_<arm>…``
under the working directory) and prints the Markdown table.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eval.bootstrap import check_bootstrap_settings, index_matrix, paired_bootstrap
from eval.metrics import per_problem_accuracy, summarize
from eval.results import FINGERPRINT_FILE, ResultStore, _diff, is_grading_error, with_recorded_length
from zoomr.jsonl import read_json_object
from zoomr.paths import output_dir
from zoomr.rundir import write_text_atomic

ARM_FIELDS = ("model", "method")  # what arms are meant to differ in


@dataclass
class Run:
    """One run directory: its arm label, benchmark and the rows in its configured scope."""

    path: Path
    arm: str
    benchmark: str
    rows: list[dict[str, Any]]
    samples: int
    settings: dict[str, Any] | None = None  # fingerprint.json without model/method (None: none written)
    scored: bool = False  # a task scored per sample in [0, 1] (RULER, LongBench): correct = a full score


class CompareError(ValueError):
    pass


def load_run(path: str | Path, label: str | None = None) -> Run:
    from eval.tasks import SCOPE_FILE, ScoredTask, get_task, read_scope
    from zoomr.schemas import to_dataclass
    from zoomr.schemas.checks import is_finite_number
    from zoomr.schemas.eval import BenchmarkConfig, GradingConfig

    path = Path(path)
    config_file = path / "config.json"
    if not config_file.exists():
        raise CompareError(f"{path}: not an evaluation run directory (no config.json)")
    fingerprint = path / FINGERPRINT_FILE
    try:
        config = read_json_object(config_file, "run config")
        recorded = read_json_object(fingerprint, "fingerprint") if fingerprint.is_file() else None
    except ValueError as e:
        raise CompareError(str(e)) from None
    try:  # a training run's or a checkpoint's config.json, or an edited one: named, not a traceback
        bench = to_dataclass(BenchmarkConfig, config["benchmark"])
        task = get_task(bench.task)
        n = config["generation"]["n_samples"]
        arm = label or f"{config['model']['name']}/{config['run_name']}"
    except KeyError as e:
        raise CompareError(f"{config_file}: not an evaluation run's config (no {e.args[0]!r} field)") from None
    except (TypeError, ValueError) as e:
        raise CompareError(f"{config_file}: not an evaluation run's config ({e})") from None
    if type(n) is not int or n < 1:
        raise CompareError(f"{config_file}: generation.n_samples={n!r}, not a positive integer")
    if task.scoped:  # generated / hub problems (RULER, LongBench): the ids the run recorded
        try:
            ids = read_scope(path)
        except FileNotFoundError as e:
            raise CompareError(str(e)) from None
        if problem := scope_problem(ids):  # an empty or edited list: no table over zero or doubled problems
            raise CompareError(f"{path / SCOPE_FILE}: {problem}")
    else:
        try:  # the hub unreachable here was a RuntimeError traceback; a moved data_dir named no run
            ids = [p.id for p in task.load(bench)]
        except (ValueError, RuntimeError, FileNotFoundError) as e:
            raise CompareError(f"{path}: the problems of its benchmark {bench.name!r} cannot be listed here, so its "
                               f"rows cannot be checked: {e}") from None  # fmt: skip
    scope = [(pid, s) for pid in ids for s in range(n)]
    rows = ResultStore(path).load(repair=False)  # read only: the run may be writing its next row
    missing = [k for k in scope if k not in rows]
    if missing:
        raise CompareError(
            f"{path}: incomplete run, {len(scope) - len(missing)} of {len(scope)} samples done "
            f"(first missing {missing[0]}); rerun the same command to finish it"
        )
    failed = [k for k in scope if is_grading_error(rows[k])]  # counted as incorrect: the run's accuracy, not the arm's
    grading = config.get("grading")
    limit = grading.get("max_error_rate") if isinstance(grading, dict) else None
    limit = limit if is_finite_number(limit) else GradingConfig.max_error_rate  # the default where not recorded
    if len(failed) > limit * len(scope):
        raise CompareError(
            f"{path}: grading failed for {len(failed)} of {len(scope)} samples (first {failed[0]}), more than "
            f"grading.max_error_rate={limit}; they would count as incorrect. Rerun the same command to grade them again"
        )
    settings = None
    if recorded is not None:  # an older fingerprint without benchmark.length: the config's (the last run's)
        recorded = with_recorded_length(recorded, bench.length)
        settings = comparable_settings(recorded, task.arm_options, task.option_defaults())
    return Run(path, arm, bench.name, [rows[k] for k in scope], n, settings, isinstance(task, ScoredTask))


def scope_problem(ids: Any) -> str | None:
    """Why a run's recorded problem ids (``problems.json``) cannot be its scope (None when they can)."""
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        return "not a list of problem ids (strings)"
    if not ids:
        return "lists no problems: the run covers none, so it has no accuracy to compare"
    if repeated := sorted(i for i, n in Counter(ids).items() if n > 1):
        return f"lists problems more than once ({repeated[:5]}): their samples would count twice"
    return None


def comparable_settings(
    fingerprint: dict[str, Any], arm_options: tuple[str, ...] = (), option_defaults: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The fingerprint without what arms are meant to differ in: model, method, and the benchmark options a
    method sets without changing the problems (the task's ``arm_options``, e.g. the testbed's ``thought_splitter``).
    Options the run does not record take the task's defaults (``option_defaults``: a run made before an option
    existed ran with its default)."""
    settings = {k: v for k, v in fingerprint.items() if k not in ARM_FIELDS}
    bench = settings.get("benchmark")
    if isinstance(bench, dict) and isinstance(bench.get("options"), dict):
        recorded = {**(option_defaults or {}), **bench["options"]}
        options = {k: v for k, v in recorded.items() if k not in arm_options}
        settings["benchmark"] = {**bench, "options": options}
    return settings


def setting_differences(runs: list[Run]) -> list[str]:
    """Each field in which an arm's settings differ from the reference arm's on the same benchmark."""
    out = []
    for run in runs[1:]:
        ref = runs[0]
        if ref.settings is None or run.settings is None:
            continue
        out += [f"{run.arm} vs {ref.arm} ({run.benchmark}): {d}" for d in _diff(ref.settings, run.settings)]
    return out


def check_same_problems(runs: list[Run]) -> list[str]:
    """The common problem ids (in the reference's order); an error if any arm's set differs."""
    ref = list(dict.fromkeys(r["problem_id"] for r in runs[0].rows))
    ref_set = set(ref)
    for run in runs[1:]:
        ids = set(r["problem_id"] for r in run.rows)
        if ids != ref_set:
            only_ref, only_run = sorted(ref_set - ids), sorted(ids - ref_set)
            raise CompareError(
                f"benchmark {runs[0].benchmark}: arms {runs[0].arm!r} and {run.arm!r} cover different problems "
                f"({len(ref_set)} vs {len(ids)}; only in the first: {only_ref[:5]}{'...' if len(only_ref) > 5 else ''}; "
                f"only in the second: {only_run[:5]}{'...' if len(only_run) > 5 else ''}). "
                "Paired comparisons need the same problems: rerun with the same benchmark and problem_limit."
            )
    return ref


def compare(
    runs: list[Run],
    n_resamples: int = 2000,
    seed: int = 1234,
    confidence: float = 0.95,
    allow_different_settings: bool = False,
) -> dict[str, Any]:
    """Per arm and benchmark: accuracy, Δ vs the first arm with its paired-bootstrap interval, KV, length.

    Arms run with different settings (e.g. 48 vs 160 new tokens) are refused unless
    ``allow_different_settings``; the differences are listed in ``result["setting_differences"]``."""
    arms = list(dict.fromkeys(r.arm for r in runs))
    benchmarks = list(dict.fromkeys(r.benchmark for r in runs))
    by_key: dict[tuple[str, str], Run] = {}
    given: dict[Path, Run] = {}
    for r in runs:
        if (other := given.setdefault(r.path.resolve(), r)) is not r:  # under two labels: Δ 0 against itself
            raise CompareError(f"{r.path} is given twice (arms {other.arm!r} and {r.arm!r}): an arm would be compared "
                               "with itself")  # fmt: skip
        if (r.arm, r.benchmark) in by_key:
            raise CompareError(
                f"two runs of arm {r.arm!r} on {r.benchmark}: {by_key[r.arm, r.benchmark].path}, {r.path}"
            )
        by_key[r.arm, r.benchmark] = r
    reference = arms[0]
    out: dict[str, Any] = {
        "reference": reference,
        "benchmarks": benchmarks,
        "n_resamples": n_resamples,
        "seed": seed,
        "confidence": confidence,
        "setting_differences": [],
        "arms": {},
    }
    if scored := list(dict.fromkeys(r.benchmark for r in runs if r.scored)):  # their avg@k: the full-score share
        out["full_score_benchmarks"] = scored
    for arm in arms:
        out["arms"][arm] = {}
    for bench in benchmarks:
        present = [by_key[a, bench] for a in arms if (a, bench) in by_key]
        ref_run = by_key.get((reference, bench))
        ids = check_same_problems(present)
        settings_ref = ref_run or present[0]  # without the reference arm the others share a column all the same
        diffs = setting_differences([settings_ref, *[r for r in present if r is not settings_ref]])
        if diffs and not allow_different_settings:
            raise CompareError(
                "arms ran with different settings, so their accuracies are not comparable:\n  "
                + "\n  ".join(diffs[:20])
                + "\nRerun the arm with the reference's settings, or pass --allow-different-settings "
                "(the table then lists these differences)"
            )
        out["setting_differences"] += diffs
        indices = index_matrix(len(ids), n_resamples, seed) if ref_run is not None and len(ids) > 1 else None
        ref_acc = per_problem_accuracy(ref_run.rows) if ref_run is not None else None
        for run in present:
            metrics = summarize(run.rows)
            entry: dict[str, Any] = {
                "run_dir": str(run.path),
                "samples_per_problem": run.samples,
                "metrics": metrics,
            }
            if ref_acc is not None and run.arm != reference and indices is not None:
                acc = per_problem_accuracy(run.rows)
                ci = paired_bootstrap(
                    np.array([acc[i] for i in ids]),
                    np.array([ref_acc[i] for i in ids]),
                    indices,
                    confidence=confidence,
                )
                entry["delta"] = {
                    "delta": ci.delta,
                    "low": ci.low,
                    "high": ci.high,
                    "n_problems": ci.n_problems,
                }
            elif ref_acc is not None and run.arm != reference:  # one problem: a difference, but no interval
                acc = per_problem_accuracy(run.rows)
                entry["delta"] = {"delta": acc[ids[0]] - ref_acc[ids[0]], "low": None, "high": None, "n_problems": 1}
            out["arms"][run.arm][bench] = entry
    return out


def confidence_label(confidence: float) -> str:
    """``95%``, ``97.5%``: the level as given (``int(100 * 0.975)`` showed 97, ``int(100 * 0.58)`` 57)."""
    return f"{100 * confidence:g}%"


def _pts(x: float, signed: bool = False) -> str:
    return f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}"


def table_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Header and cells of the Table-1 layout."""
    benches = result["benchmarks"]
    primary = benches[0]
    header = ["Arm", "KV/512", "Mean KV (MiB)"]
    for b in benches:
        full_score = " (score 1)" if b in result.get("full_score_benchmarks", ()) else ""
        header += [f"{b} avg@k{full_score}", f"Δ {b} [{confidence_label(result['confidence'])} CI]"]
    header += [f"Trunc. % ({primary})", f"Tokens ({primary})"]
    rows = []
    for arm, per_bench in result["arms"].items():
        first = per_bench.get(primary, {}).get("metrics", {})
        kv, kv_bytes = first.get("kv_per_512"), first.get("bytes_mean")
        cells = [
            arm,
            "—" if kv is None else f"{kv:.0f}",
            "—" if kv_bytes is None else f"{kv_bytes / 2**20:.1f}",
        ]
        for b in benches:
            entry = per_bench.get(b)
            if entry is None:
                cells += ["—", "—"]
                continue
            m = entry["metrics"]
            cells.append(f"{_pts(m['accuracy'])} (avg@{entry['samples_per_problem']})")
            d = entry.get("delta")
            cells.append(
                "ref"
                if arm == result["reference"]
                else (
                    "—"
                    if d is None
                    else f"{_pts(d['delta'], True)} [one problem: no interval]"
                    if d["low"] is None
                    else f"{_pts(d['delta'], True)} [{_pts(d['low'], True)}, {_pts(d['high'], True)}]"
                )
            )
        cells += [
            "—" if not first else _pts(first["truncation_rate"]),
            "—" if not first else f"{first['mean_tokens']:.0f}",
        ]
        rows.append(cells)
    return header, rows


def full_score_note(result: dict[str, Any]) -> str:
    """What avg@k means on the benchmarks scored per sample in [0, 1] (RULER, LongBench): '' when there are none."""
    scored = result.get("full_score_benchmarks") or []
    if not scored:
        return ""
    return (f"On {', '.join(scored)} (scored per sample in [0, 1]) avg@k and Δ count the samples with a full score "
            "(score 1), not the benchmark's mean score (metrics.json's subset scores and averages; python -m "
            "analysis.paper_tables' kvzap_subsets table).")  # fmt: skip


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def write_outputs(result: dict[str, Any], out_dir: Path) -> str:
    header, rows = table_rows(result)
    md = markdown(header, rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    note = (
        f"Reference: {result['reference']}. Δ: paired difference in accuracy points, per-problem mean correctness, "
        f"{result['n_resamples']} bootstrap resamples of problems (one shared index matrix, seed {result['seed']}), "
        "percentile interval. KV/512: persistent KV rows per 512 generated tokens per KV head; Mean KV: resident "
        "K/V bytes of one sequence averaged over its decode steps; both on the first benchmark."
    )
    if scored := full_score_note(result):
        note += " " + scored
    if result.get("setting_differences"):
        note += "\n\nWARNING: arms ran with different settings:\n" + "\n".join(
            f"- {d}" for d in result["setting_differences"]
        )
    rows_csv = io.StringIO()
    csv.writer(rows_csv).writerows([header, *rows])
    # each through a rename: a kill leaves every table old or new, never torn (a csv was emptied before its rows)
    write_text_atomic(out_dir / "table.md", md + "\n\n" + note + "\n")
    write_text_atomic(out_dir / "table.csv", rows_csv.getvalue(), newline="")
    write_text_atomic(out_dir / "table.json", json.dumps(result, indent=2))
    return md + "\n\n" + note


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eval.compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run directories; the first arm is the reference")
    ap.add_argument("--labels", nargs="+", help="arm label per run directory (default model/run_name)")
    ap.add_argument(
        "--out",
        type=output_dir,
        default=None,
        help="output directory (default runs/compare/<arm>_vs_<arm>... in the working directory)",
    )
    ap.add_argument(
        "--allow-different-settings",
        action="store_true",
        help="compare arms whose fingerprints differ beyond model/method (listed in the table) instead of refusing",
    )
    ap.add_argument("--n-resamples", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--confidence", type=float, default=0.95)
    args = ap.parse_args(argv)
    if args.labels and len(args.labels) != len(args.runs):
        ap.error(f"--labels needs one label per run ({len(args.runs)}), got {len(args.labels)}")
    try:
        check_bootstrap_settings(args.n_resamples, args.confidence, args.seed)
    except ValueError as e:
        ap.error(str(e).replace("n_resamples=", "--n-resamples ").replace("confidence=", "--confidence ")
                 .replace("seed=", "--seed "))
    try:
        runs = [load_run(p, args.labels[i] if args.labels else None) for i, p in enumerate(args.runs)]
        result = compare(runs, args.n_resamples, args.seed, args.confidence, args.allow_different_settings)
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    arms = "_vs_".join(a.replace("/", "-") for a in result["arms"])
    out = Path(args.out or f"runs/compare/{arms[:120]}")
    print(write_outputs(result, out))
    print(f"\nwritten: {out}/table.md, table.csv, table.json")
    return 0


if __name__ == "__main__":
    from zoomr.script import run_script

    run_script(main)
