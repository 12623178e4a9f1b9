"""AbridgeKV (papers/abridgekv*): Table 1 and Figures 3a-3d, 4a, 6 from evaluation, bench and allocation runs.

- Table 1: every arm of a model (full KV the reference), :func:`eval.compare.compare`'s layout.
- 3a: accuracy vs KV/512 (persistent rows per 512 generated tokens per KV head), per benchmark.
- 3b: decode throughput vs batch size, each policy ÷ full KV (``analysis.bench_throughput``).
- 3c: sequences whose KV fits in a fixed memory (``memory_gib``): floor(memory / the device K/V bytes a running
  sequence holds averaged over its generation), as the paper counts (8 GiB / 369 MiB = 22) — the measured bytes
  of the policy's tensors, not a formula.
- 3d: time to finish the arm's own requests at its fastest concurrency cap (``bench_throughput --eval-runs``),
  ÷ full KV's when full KV was timed, vs accuracy; shaded: at least as accurate as full KV and faster.
- 4a: distribution of generated tokens per sample, per arm (cap = ``generation.max_new_tokens``).
- 6: per-layer held-out CE increase when a layer's quota is halved, and the three-level schedule.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .common import compare_table, fed_by, ordered, pct, pyplot, sources
from .inputs import Inputs
from .report import Report


def table1(inputs: Inputs, report: Report, n_resamples: int, seed: int, allow_different_settings: bool) -> None:
    if not inputs.evals:
        report.skip("abridge_table1", "no evaluation run directory among the inputs")
    for model in inputs.models():
        compare_table(report, f"abridge_table1_{model}", f"AbridgeKV Table 1 — {model}", inputs.arms(model),
                      n_resamples, seed, allow_different_settings=allow_different_settings)  # fmt: skip


def fig3a(inputs: Inputs, report: Report) -> None:
    if not inputs.evals:
        report.skip("abridge_fig3a", "no evaluation run directory among the inputs")
    plt = pyplot()
    for model in inputs.models():
        arms = [a for a in ordered(inputs.arms(model)) if "kv_per_512" in a.pooled]
        if not arms:
            report.skip(f"abridge_fig3a_{model}", f"no arm of {model} recorded resident KV (kv_per_512)")
            continue
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        for bench, marker in zip(dict.fromkeys(a.benchmark for a in arms), "osD^v<>"):
            mine = [a for a in arms if a.benchmark == bench]
            xs, ys = [a.pooled["kv_per_512"] for a in mine], [pct(a.pooled["accuracy"]) for a in mine]
            ax.scatter(xs, ys, marker=marker, label=bench)
            for a, x, y in zip(mine, xs, ys):
                ax.annotate(a.label, (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel("KV/512 (persistent KV rows per 512 generated tokens per KV head)")
        ax.set_ylabel(f"accuracy avg@{arms[0].run.samples} (%)")
        ax.legend(fontsize=7)
        report.figure(f"abridge_fig3a_{model}", fig, f"AbridgeKV Fig. 3a — accuracy vs KV/512 ({model})",
                      sources(arms), fed_by(arms))  # fmt: skip


def fig3b(inputs: Inputs, report: Report) -> None:
    if not inputs.throughput:
        report.skip("abridge_fig3b", "no bench_throughput.json among the inputs (python -m analysis.bench_throughput)")
        return
    plt = pyplot()
    for i, bench in enumerate(inputs.throughput):
        tp, meta = bench.data["throughput"], bench.data["meta"]
        key = "abridge_fig3b" + (f"_{i}" if len(inputs.throughput) > 1 else "")
        if "full" not in tp:
            report.skip(key, f"{bench.path}: no 'full' policy to divide by (rerun with --policies full ...)")
            continue
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        header, rows = ["policy"], []
        sizes = list(tp["full"])
        header += [f"tok/s b={b}" for b in sizes] + [f"÷ full b={b}" for b in sizes]
        for name, per in tp.items():
            bs = [int(b) for b in per]
            ax.plot(bs, [per[b]["ratio_vs_full"] for b in per], marker="o", label=name)
            rows.append([name] + [f"{per[b]['tokens_per_s']:.1f}" for b in per]
                        + [f"{per[b]['ratio_vs_full']:.2f}" for b in per])  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.axhline(1.0, color="0.6", lw=0.8, ls="--")
        ax.set_xlabel("batch size (sequences decoded together)")
        ax.set_ylabel("decode throughput ÷ full KV (tokens/s ratio)")
        ax.legend(fontsize=7)
        what = (f"{meta.get('model')} on {meta.get('device')}, prompt {meta.get('prompt_tokens')} + "
                f"{meta.get('new_tokens')} new tokens, budget {meta.get('budget')} rows")  # fmt: skip
        report.figure(key, fig, "AbridgeKV Fig. 3b — decode throughput vs batch size", [str(bench.path)], what)
        report.table(key + "_table", "Decode throughput per policy and batch size", header, rows,
                     [str(bench.path)], what)  # fmt: skip


def fig3c(inputs: Inputs, report: Report, memory_gib: float) -> None:
    if not inputs.evals:
        report.skip("abridge_fig3c", "no evaluation run directory among the inputs")
    plt = pyplot()
    budget = memory_gib * 2**30
    for model in inputs.models():
        bench = inputs.arms(model)[0].benchmark
        every = ordered(inputs.arms(model, bench))
        arms = [a for a in every if a.pooled.get("bytes_mean")]
        absent = [a.label for a in every if a not in arms]
        key = f"abridge_fig3c_{model}"
        if absent:
            report.skip(f"{key}:{','.join(absent)}", f"no device KV bytes measured for {', '.join(absent)} "
                        "(an offloading policy keeps its KV on the host when there is no GPU)")  # fmt: skip
        if not arms:
            report.skip(key, f"no arm of {model} on {bench} recorded per-sequence KV bytes (bytes_peak)")
            continue
        fits = [int(budget // a.pooled["bytes_mean"]) for a in arms]
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        ax.bar([a.label for a in arms], fits, color="tab:blue")
        ax.set_yscale("log")
        ax.set_ylabel(f"sequences fitting in {memory_gib:g} GiB of KV")
        ax.set_xlabel("arm")
        ax.tick_params(axis="x", rotation=30, labelsize=7)
        report.figure(key, fig, f"AbridgeKV Fig. 3c — sequences in {memory_gib:g} GiB ({model}, {bench})",
                      sources(arms), fed_by(arms))  # fmt: skip
        full = next((f for a, f in zip(arms, fits) if a.method == "full"), None)
        rows = [[a.label, f"{a.pooled['bytes_mean'] / 2**20:.3f}", f"{a.pooled['bytes_peak_mean'] / 2**20:.3f}", f,
                 "—" if not full else f"{f / full:.2f}"] for a, f in zip(arms, fits)]  # fmt: skip
        report.table(key + "_table", f"Sequences in {memory_gib:g} GiB of KV ({model}, {bench})",
                     ["arm", "mean KV per sequence (MiB)", "peak KV per sequence (MiB)", f"sequences in {memory_gib:g} GiB",
                      "× full KV"], rows, sources(arms), fed_by(arms), "Sequences = memory ÷ the K/V bytes a running "
                     "sequence holds on the device averaged over its generation (AbridgeKV §4: 8 GiB ÷ 369 MiB = 22), "
                     "measured from the tensors the policy holds; mean over samples. Peak shown for reference." + (f" Not shown (no device bytes): "
                     f"{', '.join(absent)}." if absent else ""))  # fmt: skip


def fig3d(inputs: Inputs, report: Report) -> None:
    finish = [f for b in inputs.throughput for f in b.data.get("finish", [])]
    if not finish:
        report.skip("abridge_fig3d", "no time-to-finish measurement among the inputs "
                    "(python -m analysis.bench_throughput --eval-runs <eval run dirs>)")  # fmt: skip
        return
    by_dir = {Path(a.run.path).resolve(): a for a in inputs.evals}
    pairs, unmatched = [], []
    for f in finish:
        arm = by_dir.get(Path(f["run_dir"]).resolve())
        (pairs.append((arm, f)) if arm else unmatched.append(f["run_dir"]))
    for run_dir in unmatched:
        inputs.problems.append(f"{run_dir}: timed by bench_throughput, but its eval run is not among the inputs")
    if not pairs:
        report.skip("abridge_fig3d", f"none of the timed eval runs are among the inputs: {unmatched}")
        return
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    full = next(((a, f) for a, f in pairs if a.method == "full"), None)
    x = {id(f): f["seconds"] / full[1]["seconds"] if full else f["seconds_per_request"] for _, f in pairs}
    if full:  # shaded: at least as accurate as full KV and faster (the paper's region)
        ref_acc = pct(full[0].pooled["accuracy"])
        ax.fill_between([0, 1], ref_acc, 100, color="tab:green", alpha=0.08, lw=0)
        ax.axhline(ref_acc, color="0.6", lw=0.8, ls="--")
        ax.axvline(1.0, color="0.6", lw=0.8, ls="--")
    for arm, f in pairs:
        y = pct(arm.pooled["accuracy"])
        ax.scatter(x[id(f)], y)
        ax.annotate(f"{arm.label} (cap {f['batch']})", (x[id(f)], y), fontsize=7, xytext=(3, 3),
                    textcoords="offset points")  # fmt: skip
    accs = [pct(a.pooled["accuracy"]) for a, _ in pairs]
    ax.set_ylim(max(0, min(accs) - 5), min(100, max(accs) + 5))
    n = sorted({f["requests"] for _, f in pairs})
    ax.set_xlabel(f"time to finish {'/'.join(map(str, n))} requests ÷ full KV's" if full
                  else "time to finish, seconds per request")  # fmt: skip
    ax.set_ylabel("accuracy avg@k (%)")
    arms = [a for a, _ in pairs]
    report.figure("abridge_fig3d", fig, "AbridgeKV Fig. 3d — time to finish vs accuracy",
                  sources(arms) + [str(b.path) for b in inputs.throughput], fed_by(arms))  # fmt: skip
    rows = [[a.label, a.benchmark, f["requests"], f["batch"], f"{f['seconds']:.2f}",
             f"{x[id(f)]:.2f}" if full else "—", f"{pct(a.pooled['accuracy']):.1f}"] for a, f in pairs]  # fmt: skip
    report.table("abridge_fig3d_table", "Time to finish and accuracy per arm",
                 ["arm", "benchmark", "requests", "best cap", "seconds", "÷ full", "accuracy (%)"], rows,
                 sources(arms), fed_by(arms), "Static batches up to each concurrency cap; the fastest cap is the "
                 "arm's time. Requests replay the arm's own prompt and generation lengths.")  # fmt: skip


def fig4a(inputs: Inputs, report: Report) -> None:
    if not inputs.evals:
        report.skip("abridge_fig4a", "no evaluation run directory among the inputs")
    plt = pyplot()
    for model in inputs.models():
        bench = inputs.arms(model)[0].benchmark
        arms = ordered(inputs.arms(model, bench))
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        lengths = [np.array([r["n_tokens"] for r in a.run.rows]) for a in arms]
        top = max(int(x.max()) for x in lengths)
        bins = np.linspace(0, top + 1, 21)
        for a, x in zip(arms, lengths):
            ax.hist(x, bins=bins, histtype="step", label=f"{a.label} (mean {x.mean():.0f})")
        cap = arms[0].config.get("generation", {}).get("max_new_tokens")
        if cap:
            ax.axvline(cap, color="0.5", ls="--", lw=0.8)
        ax.set_xlabel(f"generated tokens per sample (cap {cap})")
        ax.set_ylabel("samples")
        ax.legend(fontsize=7)
        report.figure(f"abridge_fig4a_{model}", fig, f"AbridgeKV Fig. 4a — generated tokens ({model}, {bench})",
                      sources(arms), fed_by(arms))  # fmt: skip


def fig6(inputs: Inputs, report: Report) -> None:
    if not inputs.allocations:
        report.skip("abridge_fig6", "no abridge_allocate run directory (schedule.json) among the inputs "
                    "(python -m train +method=abridge_allocate method.checkpoint=<uniform model>)")  # fmt: skip
        return
    plt = pyplot()
    for i, alloc in enumerate(inputs.allocations):
        s = alloc.data
        costs, quotas, base = s["costs"], s["quotas"], s["base_quota"]
        key = "abridge_fig6" + (f"_{i}" if len(inputs.allocations) > 1 else "")
        fig, ax = plt.subplots(figsize=(max(5.5, 0.3 * len(costs) + 2), 3.8))
        colors = {2 * base: "tab:red", base: "tab:gray", base // 2: "tab:blue"}
        ax.bar(range(len(costs)), costs, color=[colors.get(q, "black") for q in quotas])
        ax.set_xlabel("layer")
        ax.set_ylabel(f"held-out CE increase (nats)\nquota {base} → {base // 2}")
        twin = ax.twinx()
        twin.step(range(len(quotas)), quotas, where="mid", color="black", lw=1.2)
        twin.set_ylabel("schedule: code rows per block")
        what = f"{s.get('heldout_examples', '?')} held-out examples, base CE {s.get('base_heldout_ce', float('nan')):.4f}"
        report.figure(key, fig, "AbridgeKV Fig. 6 — per-layer cost of halving the quota, and the schedule",
                      [str(alloc.path), str(s.get("checkpoint", ""))], what)  # fmt: skip
        rows = [[layer, f"{c:+.5f}", q] for layer, (c, q) in enumerate(zip(costs, quotas))]
        report.table(key + "_table", "AbridgeKV per-layer quota schedule", ["layer", "CE increase (nats)", "quota"],
                     rows, [str(alloc.path)], what)  # fmt: skip


def build(inputs: Inputs, report: Report, memory_gib: float, n_resamples: int, seed: int,
          allow_different_settings: bool = False) -> None:  # fmt: skip
    table1(inputs, report, n_resamples, seed, allow_different_settings)
    fig3a(inputs, report)
    fig3b(inputs, report)
    fig3c(inputs, report, memory_gib)
    fig3d(inputs, report)
    fig4a(inputs, report)
    fig6(inputs, report)
