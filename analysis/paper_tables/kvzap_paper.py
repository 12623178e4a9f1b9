"""KVzap (papers/kvzap*): Table 1, accuracy vs compression, per-prompt compression, threshold vs fixed ratio.

- Table 1: held-out R² (squared Pearson, mean over layers and KV heads) of the linear and MLP surrogates per
  model, from ``python -m train +method=kvzap`` run directories (``r2.json``), plus the per-layer table
  (:func:`train.kvzap.layer_table`).
- Compression of a sample = 1 − resident rows at its end / (prompt + cached generated tokens), i.e.
  1 − ``kv_per_512_all`` / 512 (:func:`eval.generation.kv_stats`): the share of KV pairs removed.
- Accuracy vs compression: the KVzap arms (one per threshold) as a line, every other compressing arm
  (StreamingLLM, H2O, SnapKV, the KVzip+ oracle, ...) as points at its measured compression.
- Per-prompt compression: each sample's compression vs its prompt length, per threshold (the adaptivity figure).
- Threshold vs fixed ratio: threshold rules (``kvzap``, ``kvzip mode=threshold``) against the fixed-ratio
  top-k rule (``kvzip mode=ratio``), accuracy vs compression.
- RULER / LongBench (``benchmark=ruler|longbench``, §4.4-4.5): the y-axis is the benchmark's own score (mean
  over subsets of RULER's string match / LongBench's metrics, :mod:`eval.tasks`) instead of accuracy, and a
  per-subset table and figure (score vs compression per subset, Fig. 9-15; LongBench also without TREC, Fig. 12).
"""

from __future__ import annotations

import numpy as np

from eval.tasks import TASKS, ScoredTask, get_task, subset_metrics
from train.kvzap import layer_table

from .common import fed_by, ordered, pct, pyplot, sources
from .inputs import EvalArm, Inputs
from .report import Report


def compression(kv: dict) -> float | None:
    v = kv.get("kv_per_512_all")
    return None if v is None else 1.0 - v / 512.0


def unmeasured_note(arms: list[EvalArm]) -> str:
    """The table note naming arms drawn nowhere for want of a measured compression (``kv_per_512_all``: runs made
    before it was recorded, or resumed across that version); "" when every arm has one."""
    missing = [describe(a) for a in arms if compression(a.pooled) is None]
    return (f"Not drawn (no measured compression, `kv_per_512_all`; rerun to measure it): {', '.join(missing)}."
            if missing else "")


def long_context(arm: EvalArm) -> dict | None:
    """A RULER / LongBench arm's per-subset scores and averages (:func:`eval.tasks.subset_metrics`); None otherwise."""
    name = (arm.config.get("benchmark") or {}).get("task", "")
    task = get_task(name) if name in TASKS else None
    return subset_metrics(task, arm.run.rows) if isinstance(task, ScoredTask) else None


def score(arm: EvalArm) -> tuple[float, str]:
    """The arm's y value and its axis label: the benchmark score (RULER / LongBench) or accuracy avg@k."""
    lc = long_context(arm)
    if lc is not None:
        return lc["average"], f"{arm.config['benchmark']['task']} average score"
    return pct(arm.pooled["accuracy"]), f"accuracy avg@{arm.run.samples} (%)"


def rule(arm: EvalArm) -> str | None:
    """``threshold`` | ``ratio`` for the KVzap / KVzip+ arms, None for the others."""
    m = arm.method_config
    if arm.method == "kvzap" or m.get("policy") == "kvzap":
        return "threshold"
    if m.get("policy") == "kvzip":
        return m.get("mode", "ratio")
    return None


def describe(arm: EvalArm) -> str:
    m = arm.method_config
    if rule(arm) == "threshold":
        return f"{arm.label} (τ={m.get('threshold')})"
    if rule(arm) == "ratio":
        return f"{arm.label} (ratio {m.get('ratio')})"
    return arm.label


def table1(inputs: Inputs, report: Report) -> None:
    if not inputs.kvzap_fits:
        report.skip("kvzap_table1", "no KVzap surrogate fit (r2.json) among the inputs (python -m train +method=kvzap)")
        return
    header = ["model", "target", "layers", "KV heads", "R² linear", "R² MLP", "det linear", "det MLP"]
    rows, srcs = [], []
    for fit in inputs.kvzap_fits:
        r2 = fit.data
        kinds = list(dict.fromkeys(r["kind"] for r in r2))
        mean = {(k, m): np.mean([r[m] for r in r2 if r["kind"] == k]) for k in kinds for m in ("r2", "det")}
        model = fit.config.get("model", {}).get("name", "?")
        target = fit.config.get("method", {}).get("fit", {}).get("target", "?")
        cells = [f"{mean[k, m]:.3f}" if (k, m) in mean else "—" for m in ("r2", "det") for k in ("linear", "mlp")]
        rows.append([model, target, len({r["layer"] for r in r2}), len({r["head"] for r in r2}), *cells])
        srcs.append(str(fit.path))
        cols, per_layer = layer_table(r2, kinds)
        report.table(f"kvzap_r2_per_layer_{model}", f"KVzap held-out R² per layer — {model}", cols,
                     [[c if isinstance(c, int) else f"{c:.3f}" for c in row] for row in per_layer], [str(fit.path)],
                     f"{len(r2)} (kind, layer, head) fits")  # fmt: skip
    report.table("kvzap_table1", "KVzap Table 1 — surrogate R² (linear vs MLP)", header, rows, srcs,
                 f"{len(rows)} fit run(s)", "R²: squared Pearson correlation of predicted and true log s⁺ on "
                 "held-out pairs; det: coefficient of determination; both averaged over layers and KV heads.")  # fmt: skip


def points(arms: list[EvalArm]) -> list[tuple[EvalArm, float, float]]:
    out = []
    for a in arms:
        c = compression(a.pooled)
        if c is not None:
            out.append((a, c, score(a)[0]))
    return out


def accuracy_vs_compression(inputs: Inputs, report: Report) -> None:
    plt = pyplot()
    done = False
    for model in inputs.models():
        for bench in dict.fromkeys(a.benchmark for a in inputs.arms(model)):
            arms = [a for a in ordered(inputs.arms(model, bench))]
            kvzap = sorted(points([a for a in arms if a.method == "kvzap"]), key=lambda p: p[1])
            if not kvzap:
                continue
            done = True
            others = points([a for a in arms if a.method != "kvzap"])
            fig, ax = plt.subplots(figsize=(5.8, 4.0))
            ax.plot([p[1] for p in kvzap], [p[2] for p in kvzap], marker="o", label="KVzap (one point per τ)")
            for a, c, y in kvzap:
                ax.annotate(f"τ={a.method_config.get('threshold')}", (c, y), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")  # fmt: skip
            for a, c, y in others:
                ax.scatter(c, y, marker="s", label=describe(a))
            ax.set_xlabel("compression (share of KV pairs removed)")
            ax.set_ylabel(score(arms[0])[1])
            ax.legend(fontsize=6)
            key = f"kvzap_accuracy_vs_compression_{model}_{bench}"
            used = [p[0] for p in kvzap + others]
            report.figure(key, fig, f"KVzap — accuracy vs compression ({model}, {bench})", sources(used), fed_by(used))
            rows = [[describe(a), a.method, f"{c:.3f}", f"{y:.1f}", f"{a.pooled.get('rows_mean', float('nan')):.1f}"]
                    for a, c, y in kvzap + others]  # fmt: skip
            report.table(key + "_table", f"KVzap thresholds and baselines at their compression ({model}, {bench})",
                         ["arm", "method", "compression", score(arms[0])[1], "mean resident rows"], rows, sources(used),
                         fed_by(used), unmeasured_note(arms))  # fmt: skip
    if not done:
        report.skip("kvzap_accuracy_vs_compression", "no KVzap (+method=kvzap) evaluation run among the inputs")


def per_prompt_compression(inputs: Inputs, report: Report) -> None:
    arms = [a for a in inputs.evals if a.method == "kvzap"]
    if not arms:
        report.skip("kvzap_per_prompt_compression", "no KVzap (+method=kvzap) evaluation run among the inputs")
        return
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.8, 4.0))
    for a in arms:
        xs = [r["prompt_tokens"] for r in a.run.rows if r.get("kv")]
        ys = [compression(r["kv"]) for r in a.run.rows if r.get("kv")]
        ax.scatter(xs, ys, s=12, label=f"{describe(a)} {a.model}/{a.benchmark} (sd {np.std(ys):.3f})")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("compression of the sample (share of KV pairs removed)")
    ax.legend(fontsize=6)
    report.figure("kvzap_per_prompt_compression", fig, "KVzap — compression per prompt (adaptivity)", sources(arms),
                  fed_by(arms))  # fmt: skip


def threshold_vs_ratio(inputs: Inputs, report: Report) -> None:
    arms = [a for a in inputs.evals if rule(a)]
    by_rule = {r: points([a for a in arms if rule(a) == r]) for r in ("threshold", "ratio")}
    if not by_rule["threshold"] or not by_rule["ratio"]:
        absent = [r for r in ("threshold", "ratio") if not by_rule[r]]
        report.skip("kvzap_threshold_vs_ratio", f"no {' and no '.join(absent)} arm among the inputs "
                    "(threshold: +method=kvzap or +method=kvzip method.mode=threshold; "
                    "ratio: +method=kvzip method.ratio=...)")  # fmt: skip
        return
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.8, 4.0))
    for r, marker in (("threshold", "o"), ("ratio", "s")):
        pts = sorted(by_rule[r], key=lambda p: p[1])
        ax.plot([p[1] for p in pts], [p[2] for p in pts], marker=marker, ls="-" if len(pts) > 1 else "",
                label=f"{r} rule: " + ", ".join(describe(p[0]) for p in pts))  # fmt: skip
    ax.set_xlabel("compression (share of KV pairs removed)")
    ax.set_ylabel("accuracy avg@k / benchmark score (%)")
    ax.legend(fontsize=6)
    used = [p[0] for pts in by_rule.values() for p in pts]
    report.figure("kvzap_threshold_vs_ratio", fig, "KVzap — threshold vs fixed-ratio top-k", sources(used),
                  fed_by(used))  # fmt: skip


def long_context_subsets(inputs: Inputs, report: Report) -> None:
    """RULER / LongBench per subset: every arm's score per subset and averaged, at its compression."""
    done = False
    for model in inputs.models():
        for bench in dict.fromkeys(a.benchmark for a in inputs.arms(model)):
            arms = [(a, long_context(a)) for a in ordered(inputs.arms(model, bench))]
            arms = [(a, m) for a, m in arms if m is not None]
            if not arms:
                continue
            done = True
            subsets = list(dict.fromkeys(s for _, m in arms for s in m["subsets"]))
            trec = any(m.get("average_without_trec") is not None for _, m in arms)
            header = ["arm", "compression", "average", *(["average w/o TREC"] if trec else []), *subsets]
            rows = []
            for a, m in arms:
                c = compression(a.pooled)
                row = [describe(a), "—" if c is None else f"{c:.3f}", f"{m['average']:.2f}"]
                row += [f"{m['average_without_trec']:.2f}"] if trec else []
                rows.append(row + [f"{m['subsets'][s]['score']:.2f}" if s in m["subsets"] else "—" for s in subsets])
            key = f"kvzap_subsets_{model}_{bench}"
            used = [a for a, _ in arms]
            report.table(key, f"KVzap — {bench} per subset ({model})", header, rows, sources(used), fed_by(used),
                         "Scores in %: RULER string-match-all (QA: -part), LongBench's per-subset metrics; "
                         "compression = share of KV pairs removed. " + unmeasured_note(used))  # fmt: skip
            plt = pyplot()
            cols = min(4, len(subsets))
            fig, axes = plt.subplots((len(subsets) + cols - 1) // cols, cols, figsize=(3 * cols, 2.4 * ((len(subsets) + cols - 1) // cols)), squeeze=False)  # fmt: skip
            for ax, sub in zip(axes.flat, subsets):
                for a, m in arms:
                    if sub in m["subsets"] and compression(a.pooled) is not None:  # never drawn at 0 as if full KV
                        ax.scatter(compression(a.pooled), m["subsets"][sub]["score"], s=14, label=describe(a))
                ax.set_title(sub, fontsize=8)
            for ax in list(axes.flat)[len(subsets) :]:
                ax.axis("off")
            axes.flat[0].legend(fontsize=5)
            fig.supxlabel("compression (share of KV pairs removed)")
            fig.supylabel("score (%)")
            report.figure(key + "_figure", fig, f"KVzap — {bench} score vs compression per subset ({model})",
                          sources(used), fed_by(used))  # fmt: skip
    if not done:
        report.skip("kvzap_subsets", "no RULER / LongBench evaluation run among the inputs (benchmark=ruler|longbench)")


def build(inputs: Inputs, report: Report) -> None:
    table1(inputs, report)
    accuracy_vs_compression(inputs, report)
    per_prompt_compression(inputs, report)
    threshold_vs_ratio(inputs, report)
    long_context_subsets(inputs, report)
