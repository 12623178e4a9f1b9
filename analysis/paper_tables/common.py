"""Helpers shared by the papers' builders: arm ordering, the eval.compare table, provenance, plotting setup."""

from __future__ import annotations

from typing import Any

from eval.compare import CompareError, compare, confidence_label, full_score_note, table_rows

from .inputs import EvalArm
from .report import Report


def ordered(arms: list[EvalArm]) -> list[EvalArm]:
    """Full KV first (the reference), then the other arms by label."""
    return sorted(arms, key=lambda a: (a.method != "full", a.label))


def sources(arms: list[EvalArm]) -> list[str]:
    return list(dict.fromkeys(str(a.run.path) for a in arms))


def fed_by(arms: list[EvalArm]) -> str:
    """``math500: 3 problems x 2 samples, 4 arms; ...`` for the arms' benchmarks."""
    parts = []
    for bench in dict.fromkeys(a.benchmark for a in arms):
        mine = [a for a in arms if a.benchmark == bench]
        problems = {a.pooled["problems"] for a in mine}
        samples = {a.run.samples for a in mine}
        parts.append(
            f"{bench}: {'/'.join(map(str, sorted(problems)))} problems × {'/'.join(map(str, sorted(samples)))} "
            f"samples, {len(mine)} arm{'s' * (len(mine) != 1)}"
        )
    return "; ".join(parts)


def compare_table(report: Report, key: str, title: str, arms: list[EvalArm], n_resamples: int, seed: int,
                  note: str = "", allow_different_settings: bool = False) -> dict[str, Any] | None:  # fmt: skip
    """The AbridgeKV Table-1 layout of :mod:`eval.compare` over ``arms`` (full KV first), plus per-competition
    accuracy columns for multi-competition benchmarks (the suite). Skipped with the reason if not comparable."""
    arms = ordered(arms)
    if not arms or arms[0].method != "full":
        report.skip(key, f"no full-KV reference arm among {[a.label for a in arms]}")
        return None
    try:
        result = compare([a.run for a in arms], n_resamples=n_resamples, seed=seed,
                         allow_different_settings=allow_different_settings)  # fmt: skip
    except CompareError as e:
        report.skip(key, str(e))
        return None
    header, rows = table_rows(result)
    primary = result["benchmarks"][0]
    header.append(f"Mean rows ({primary})")  # resident rows per (layer, KV head): the budget arms are matched on
    for row, label in zip(rows, result["arms"]):
        arm = next((a for a in arms if a.label == label and a.benchmark == primary), None)
        mean_rows = arm.pooled.get("rows_mean") if arm else None
        row.append("—" if mean_rows is None else f"{mean_rows:.1f}")
    for bench in result["benchmarks"]:
        comps = sorted({c for a in arms if a.benchmark == bench for c in a.metrics["by_competition"]})
        if len(comps) < 2:
            continue
        header += [f"{bench}:{c} avg@k" for c in comps]
        for row, label in zip(rows, result["arms"]):
            arm = next((a for a in arms if a.label == label and a.benchmark == bench), None)
            by = arm.metrics["by_competition"] if arm else {}
            row += [f"{100 * by[c]['accuracy']:.1f}" if c in by else "—" for c in comps]
    note = (
        f"Reference: {result['reference']}. Δ: paired difference in accuracy points with its "
        f"{confidence_label(result['confidence'])} paired-bootstrap interval ({n_resamples} resamples of problems, "
        f"seed {seed}). KV/512: persistent KV rows per 512 generated tokens per KV head; Mean KV: resident K/V "
        "bytes of one sequence on the device over its decode (0 for a policy that offloads to the host without a "
        "GPU); Mean rows: resident rows per (layer, KV head) over the decode, the budget arms are matched on; "
        "all on the first benchmark." + (f" {note}" if note else "")
    )
    if scored := full_score_note(result):
        note += " " + scored
    if result.get("setting_differences"):
        note += " Arms ran with different settings: " + "; ".join(result["setting_differences"]) + "."
    report.table(key, title, header, rows, sources(arms), fed_by(arms), note)
    return result


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pct(x: float) -> float:
    return 100.0 * x
