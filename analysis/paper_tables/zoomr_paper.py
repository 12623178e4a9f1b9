"""ZoomR (papers/zoomr*): the main table, resident KV vs generated length beside the MS formula, AG histogram.

- Main table: AIME25 / MATH-500 (the benchmarks present; others if neither is) × Full, StreamingLLM, H2O,
  SumR, ZoomR, in :mod:`eval.compare`'s layout; the KV columns show each arm's matched budget. Arms that are
  absent are named in the table's note and in the skip list.
- Resident KV: every sample's resident device rows per (layer, KV head) at its last step ÷ full KV's rows
  (prompt + cached generated tokens) vs its generated length, per arm, beside full KV (kept on the host by
  ZoomR's offload) and the MS formula's 1/MS = |I_f| / (N_p + N_g) (§3.5,
  :class:`zoomr.memory_model.ZoomRFootprint`) at the median prompt, with the ZoomR arm's window and consensus. The formula's
  segment lengths and |I_all| per generated token come from a ``bench_zoomr`` JSON when given, else from
  the paper's example (L̄_R = 250, L̄_S = 20, |I_all| = 80 at 16K) — the legend says which.
- AG histogram: agreeability of every recompute, from ``bench_zoomr`` JSONs that list it.
"""

from __future__ import annotations

import numpy as np

from zoomr.memory_model import PAPER_EXAMPLE, ZoomRFootprint

from .common import compare_table, fed_by, ordered, pyplot, sources
from .inputs import EvalArm, Inputs
from .report import Report

ARMS = ["full", "streaming", "h2o", "sumr", "zoomr"]
BENCHMARKS = ["aime25", "math500"]


def main_table(inputs: Inputs, report: Report, n_resamples: int, seed: int, allow_different_settings: bool) -> None:
    if not inputs.evals:
        report.skip("zoomr_table", "no evaluation run directory among the inputs")
    for model in inputs.models():
        key = f"zoomr_table_{model}"
        arms = [a for a in inputs.arms(model) if a.method in ARMS]
        paper = [a for a in arms if a.benchmark in BENCHMARKS]
        arms = paper or arms
        methods = {a.method for a in arms}
        missing = [m for m in ARMS if m not in methods]
        if "zoomr" not in methods:
            report.skip(key, f"no zoomr arm of {model} (methods present: {sorted(methods) or 'none'})")
            continue
        note = f"Arms absent from the inputs: {', '.join(missing)}." if missing else ""
        if missing:
            report.skip(key + ":missing_arms", f"{model}: no run of {', '.join(missing)}; the table shows the rest")
        if not paper:
            note += f" Neither {' nor '.join(BENCHMARKS)} was run; showing {sorted({a.benchmark for a in arms})}."
        compare_table(report, key, f"ZoomR main table — {model}", arms, n_resamples, seed, note.strip(),
                      allow_different_settings)  # fmt: skip


def formula_inputs(inputs: Inputs) -> tuple[float, float, float, str]:
    """(L̄_R, L̄_S, |I_all| per generated token, where they come from)."""
    for bench in inputs.zoomr_bench:
        meta, formula = bench.data.get("meta", {}), bench.data.get("formula", {})
        if {"para", "summary", "generate"} <= set(meta) and "n_all" in formula:
            return float(meta["para"]), float(meta["summary"]), formula["n_all"] / meta["generate"], str(bench.path)
    p = PAPER_EXAMPLE
    return p.mean_regular_len, p.mean_summary_len, p.n_selected / p.n_generated, "the paper's §3.5 example"


def formula_share(arm: EvalArm, lengths: np.ndarray, n_prompt: int, inputs: Inputs) -> tuple[np.ndarray, str]:
    """1 / MS at each generated length (|I_f| capped at full KV: before c paragraphs and the window exist,
    ZoomR holds every row), with the ZoomR arm's window and consensus."""
    m = arm.method_config
    reg, summ, rate, origin = formula_inputs(inputs)
    c, window = int(m.get("consensus", 2)), int(m.get("window", 512))
    share = [
        min(ZoomRFootprint(n_prompt, int(g), window, c, reg, summ, max(round(rate * g), c)).resident_rows / (n_prompt + g), 1.0)
        for g in lengths
    ]
    return np.array(share), f"MS formula: 1/MS (prompt {n_prompt}, window {window}, c={c}; segment lengths from {origin})"


def resident_vs_length(inputs: Inputs, report: Report) -> None:
    if not inputs.evals:
        report.skip("zoomr_resident_kv", "no evaluation run directory among the inputs")
    plt = pyplot()
    for model in inputs.models():
        key = f"zoomr_resident_kv_{model}"
        bench = next((b for b in BENCHMARKS if inputs.arms(model, b)), inputs.arms(model)[0].benchmark)
        arms = [a for a in ordered(inputs.arms(model, bench)) if a.method in ARMS]
        zoomr = next((a for a in arms if a.method == "zoomr"), None)
        if zoomr is None:
            report.skip(key, f"no zoomr arm of {model} on {bench}")
            continue
        fig, ax = plt.subplots(figsize=(6.2, 4.2))
        for a in arms:
            kv_rows = [r for r in a.run.rows if r.get("kv")]
            x = [r["n_tokens"] for r in kv_rows]
            y = [r["kv"]["rows_final"] / (r["prompt_tokens"] + r["n_tokens"] - 1) for r in kv_rows]
            ax.scatter(x, y, s=14, alpha=0.7, label=f"{a.label}: device rows ÷ full")
        top = max(r["n_tokens"] for r in zoomr.run.rows)
        g = np.linspace(1, max(top, 2), 50)
        n_prompt = int(np.median([r["prompt_tokens"] for r in zoomr.run.rows]))
        ax.axhline(1.0, color="0.4", ls="--", lw=1, label="full KV (what ZoomR keeps on the host)")
        ys, label = formula_share(zoomr, g, n_prompt, inputs)
        ax.plot(g, ys, color="tab:red", lw=1.2, label=label)
        ax.set_xlabel("generated tokens")
        ax.set_ylabel("resident KV ÷ full KV (rows, last step)")
        ax.set_ylim(0, 1.1)
        ax.legend(fontsize=6, loc="lower left")
        report.figure(key, fig, f"ZoomR — resident KV vs generated length ({model}, {bench})", sources(arms),
                      fed_by(arms))  # fmt: skip


def ag_histogram(inputs: Inputs, report: Report) -> None:
    benches = [b for b in inputs.zoomr_bench if b.data.get("agreeability")]
    if not benches:
        why = ("the bench_zoomr JSONs among the inputs list no per-recompute agreeability (rerun "
               "python -m analysis.bench_zoomr)" if inputs.zoomr_bench else "no bench_zoomr JSON among the inputs "
               "(python -m analysis.bench_zoomr --out <dir>/zoomr_rows.json); eval result rows do not record AG")  # fmt: skip
        report.skip("zoomr_ag_histogram", why)
        return
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    values = []
    for b in benches:
        ag = [v for v in b.data["agreeability"] if v is not None]
        values += ag
        ax.hist(ag, bins=np.linspace(0, 1, 21), histtype="step", label=f"{b.path.name} ({len(ag)} recomputes)")
    ax.set_xlabel("agreeability AG (share of votes on the consensus summaries)")
    ax.set_ylabel("recomputes")
    ax.legend(fontsize=7)
    report.figure("zoomr_ag_histogram", fig, f"ZoomR — AG histogram (mean {np.mean(values):.3f})",
                  [str(b.path) for b in benches], f"{len(values)} recomputes")  # fmt: skip


def build(inputs: Inputs, report: Report, n_resamples: int, seed: int, allow_different_settings: bool = False) -> None:
    main_table(inputs, report, n_resamples, seed, allow_different_settings)
    resident_vs_length(inputs, report)
    ag_histogram(inputs, report)
