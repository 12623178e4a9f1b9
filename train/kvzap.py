"""KVzap surrogate fitting (``python -m train +method=kvzap``; KVzap paper §4.1, Table 1, Appendix A).

Reads the pairs written by ``python -m data_prep +pipeline=kvzap_pairs``, fits the per-layer
KVzap-Linear (ridge) and KVzap-MLP surrogates, and writes:

- ``<method.surrogate_dir>/{linear,mlp}/``: checkpoints in kvpress's format (config.json + model.safetensors);
- ``<run_dir>/r2.csv`` and ``r2.json``: held-out squared Pearson R², determination and MSE per
  (kind, layer, head), with the constant predictor's determination;
- ``<run_dir>/r2_per_layer.png``: mean R² per layer, linear and MLP side by side;
- a printed table (per layer, linear vs MLP) and ``summary.json``.

A rerun of a finished fit prints its summary and returns; other settings, or regenerated pairs, in the same
run directory are refused (:mod:`zoomr.rundir`).
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from zoomr.cache.kvzap import KVzapMethod
from zoomr.jsonl import read_json_object
from zoomr.kvzap.fit import fit_surrogates
from zoomr.kvzap.pairs import pairs_pipeline, read_manifest
from zoomr.kvzap.surrogate import FIT_RECORD, model_identity
from zoomr.runlock import hold_run_lock
from zoomr.schemas import to_dataclass

log = logging.getLogger(__name__)



def layer_table(rows: list[dict[str, Any]], kinds: list[str]) -> tuple[list[str], list[list[Any]]]:
    """Mean over heads per layer: R² and determination of every kind, side by side."""
    layers = sorted({r["layer"] for r in rows})
    metrics = ("r2", "det", "mse")
    cols = ["layer"] + [f"{m}_{k}" for k in kinds for m in metrics] + ["const_det", "const_mse"]
    table = []
    for layer in layers:
        mine = [r for r in rows if r["layer"] == layer]
        row: list[Any] = [layer]
        for k in kinds:
            sel = [r for r in mine if r["kind"] == k]
            row += [_mean(r[m] for r in sel) for m in metrics]
        const = [r for r in mine if r["kind"] == kinds[0]]
        row += [_mean(r["const_det"] for r in const), _mean(r["const_mse"] for r in const)]
        table.append(row)
    return cols, table


def _mean(values) -> float:
    """Mean of the defined values: a head whose held-out target is constant has no R² or determination (NaN)."""
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else float("nan")


def plot_r2(rows: list[dict[str, Any]], kinds: list[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = sorted({r["layer"] for r in rows})
    fig, ax = plt.subplots(figsize=(max(5, 0.25 * len(layers) + 3), 3.5))
    width = 0.8 / len(kinds)
    for j, k in enumerate(kinds):
        means = [_mean(r["r2"] for r in rows if r["kind"] == k and r["layer"] == la) for la in layers]
        ax.bar([la + (j - (len(kinds) - 1) / 2) * width for la in layers], means, width, label=f"KVzap-{k}")
    ax.set_xlabel("layer")
    ax.set_ylabel("held-out R² (mean over KV heads)")
    ax.set_xticks(layers)
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def format_table(cols: list[str], table: list[list[Any]]) -> str:
    lines = ["  ".join(f"{c:>10}" for c in cols)]
    for row in table:
        lines.append("  ".join(f"{v:>10.4f}" if isinstance(v, float) else f"{v:>10}" for v in row))
    return "\n".join(lines)


def check_surrogate_dir(out: Path, kinds: list[str], run_dir: str | Path) -> None:
    """Refuse a fit that would replace surrogates it did not write in ``method.surrogate_dir`` (another run's fit, or
    NVIDIA's downloaded ones): ``save_pretrained`` overwrote them without a word (surrogate_dir is per model by
    default, not per run). Each fit records its run directory beside its checkpoints (``fitted_by.json``)."""
    for kind in kinds:
        if not (out / kind / "config.json").exists():
            continue
        record = out / kind / FIT_RECORD
        owner = read_json_object(record, "KVzap fit record").get("run_dir") if record.exists() else None
        if owner is None or Path(owner) != Path(run_dir).resolve():
            by = f"the fit in {owner}" if owner else "no fit of this project's (a download, or a fit before this record)"
            raise SystemExit(
                f"method.surrogate_dir={out}: {out / kind} holds surrogates written by {by}; this fit would replace "
                f"them. Give it its own method.surrogate_dir (e.g. {out}-{Path(run_dir).name}), or remove {out / kind}"
            )


def run(cfg) -> dict[str, Any]:
    from zoomr.entry import pick_device, start_run, to_plain
    from zoomr.rundir import prepare_run, write_json, write_summary

    method: KVzapMethod = to_dataclass(KVzapMethod, cfg.method)
    fit = method.fit
    manifest = read_manifest(method.pairs_dir)
    if manifest["model"]["name"] != cfg.model.name:
        raise SystemExit(
            f"pairs in {method.pairs_dir} come from model {manifest['model']['name']!r}, "
            f"not {cfg.model.name!r}: pass the matching model= or method.pairs_dir="
        )
    # a rerun of a finished fit returns its summary; other settings (or regenerated pairs) are refused
    pairs = {k: v for k, v in manifest.items() if k != "seconds"}
    digest = hashlib.sha256(json.dumps(pairs, sort_keys=True, default=str).encode()).hexdigest()[:16]
    plan = prepare_run(cfg.run_dir, to_plain(cfg), cfg.resume, derived={"pairs": digest}, title="KVzap fit")
    if plan.finished:
        return plan.finished
    kinds = list(fit.models)
    out = Path(method.surrogate_dir)
    # two fits of other run directories into one (empty) surrogate_dir both passed the check below and wrote
    # linear/ and mlp/ in turn, each recording itself: one fit's summary described the other's surrogates
    hold_run_lock(out, "KVzap fit", f"give this fit its own method.surrogate_dir (e.g. {out}-{Path(cfg.run_dir).name})")
    check_surrogate_dir(out, kinds, cfg.run_dir)
    # in W&B beside the pipeline that made its pairs (<model>/kvzap_pairs), not under the unused data=traces default
    run_dir, logger = start_run(cfg, job_type="train", target=pairs_pipeline(manifest))
    t0 = time.time()
    models, rows = fit_surrogates(
        method.pairs_dir, kinds=tuple(kinds), target=fit.target, ridge_alpha=fit.ridge_alpha,
        hidden_dim=fit.hidden_dim, max_train_pairs=fit.max_train_pairs, seed=int(cfg.seed),
        device=pick_device(cfg.device), epochs=fit.epochs, batch_size=fit.batch_size, lr=fit.lr,
        weight_decay=fit.weight_decay, clip=fit.clip,
    )  # fmt: skip
    seconds = time.time() - t0
    for kind, model in models.items():
        model.save_pretrained(str(out / kind))
        write_json(out / kind / FIT_RECORD, {"run_dir": str(Path(run_dir).resolve()),
                                             "model": model_identity(cfg.model.hf_id)})  # None: a tiny model by config
    with (run_dir / "r2.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (run_dir / "r2.json").write_text(json.dumps(rows, indent=1))
    cols, table = layer_table(rows, kinds)
    title = f"KVzap surrogates of {cfg.model.name}: held-out R² ({fit.target})"
    plot_r2(rows, kinds, run_dir / "r2_per_layer.png", title)
    print(f"\n{title}\n{format_table(cols, table)}\n", flush=True)
    summary: dict[str, Any] = {"method": method.name, "model": cfg.model.name, "target": fit.target}
    summary["pairs"] = (
        f"{manifest['n_pairs']['train']} train / {manifest['n_pairs']['val']} held-out per head"
    )
    for kind in kinds:
        sel = [r for r in rows if r["kind"] == kind]
        summary[f"r2_{kind}"] = _mean(r["r2"] for r in sel)
        summary[f"det_{kind}"] = _mean(r["det"] for r in sel)
        summary[f"mse_{kind}"] = _mean(r["mse"] for r in sel)
    const = [r for r in rows if r["kind"] == kinds[0]]
    summary["r2_constant"] = _mean(r["const_r2"] for r in const)
    summary["det_constant"] = _mean(r["const_det"] for r in const)
    summary["mse_constant"] = _mean(r["const_mse"] for r in const)
    if flat := [f"layer {r['layer']} head {r['head']}" for r in const if math.isnan(r["const_det"])]:
        summary["heads_constant_target"] = (
            f"{len(flat)} of {len(const)} ({', '.join(flat[:8])}{', …' if len(flat) > 8 else ''}): held-out target "
            "constant, R² undefined, left out of the means"
        )
        log.warning("KVzap fit: %s", summary["heads_constant_target"])
    summary.update(
        {
            "seconds": round(seconds, 1),
            "checkpoints": ", ".join(str(out / k) for k in kinds),
            "table": str(run_dir / "r2.csv"),  # per layer and kind (r2.json the same)
            "plot": str(run_dir / "r2_per_layer.png"),
            "run_dir": str(run_dir),
        }
    )
    write_summary(plan, summary, f"KVzap fit finished: {cfg.run_name}")
    logger.table("r2_per_layer", cols, table)
    logger.image("r2_per_layer_plot", run_dir / "r2_per_layer.png")
    logger.summary({k: v for k, v in summary.items() if isinstance(v, int | float)})
    logger.finish()
    return summary
