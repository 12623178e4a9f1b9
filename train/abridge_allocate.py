"""Per-layer quota allocation (``python -m train +method=abridge_allocate``; AbridgeKV §3 steps 1-3, §5.1).

Loads a model trained with a uniform quota q, halves one layer's quota at a time at evaluation time
(no retraining), records the held-out CE increase per layer, and writes a three-level schedule: the
costliest sixth of the layers 2q, the cheapest third q/2, the rest q (mean preserved), plus a bar plot
of the per-layer costs. Train on it with ``python -m train +method=abridge method.schedule=<file>``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from zoomr.abridge.artifacts import load_abridge_config
from zoomr.abridge.forward import heldout_ce
from zoomr.abridge.quotas import (
    halve_layer,
    level_counts,
    pause_positions_needed,
    save_schedule,
    three_level_schedule,
)
from zoomr.abridge.trainer import load_streams
from zoomr.entry import model_spec, pick_device, start_run, to_plain
from zoomr.models import ModelSpec, load_model, load_tokenizer
from zoomr.paths import resolve_repo_path
from zoomr.rundir import prepare_run
from zoomr.schemas import to_dataclass
from zoomr.schemas.abridge import AbridgeAllocateMethod
from zoomr.schemas.checks import SettingsError

log = logging.getLogger(__name__)


def layer_costs(model, streams, quotas: list[int], pad_id: int, batch_size: int, backend: str):
    """(base held-out CE, per-layer CE increase when that layer's quota alone is halved)."""
    base = heldout_ce(model, streams, quotas, pad_id, batch_size, backend)
    costs = [
        heldout_ce(model, streams, halve_layer(quotas, layer), pad_id, batch_size, backend) - base
        for layer in tqdm(range(len(quotas)), desc="halving each layer's quota")
    ]
    return base, costs


def plot_costs(path: Path, costs: list[float], schedule: list[int], base: int) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {2 * base: "tab:red", base: "tab:gray", base // 2: "tab:blue"}
    fig, ax = plt.subplots(figsize=(max(5, 0.35 * len(costs) + 2), 3.2))
    ax.bar(range(len(costs)), costs, color=[colors.get(q, "black") for q in schedule])
    ax.set_xlabel("layer")
    ax.set_ylabel(f"held-out CE increase\n(quota {base} → {base // 2})")
    ax.set_title(f"AbridgeKV layer costs\nred: {2 * base} rows, gray: {base}, blue: {base // 2}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def next_command(model: str, data: str, schedule: Path | str, num_pause: int | None = None) -> str:
    """The per-layer training run on ``schedule``: its own ``run_name``, since ``resume=auto`` refuses to
    continue the uniform run's directory (``abridge-<model>-<data>``) with other settings; ``num_pause``
    when the doubled layers need more code positions than the allocated model had."""
    k = f" method.num_pause={num_pause}" if num_pause else ""
    return (
        f"python -m train +method=abridge model={model} data={data} method.schedule={schedule}{k} "
        f"run_name=abridge_perlayer-{model}-{data}"
    )


def run(cfg) -> dict[str, Any]:
    m: AbridgeAllocateMethod = to_dataclass(AbridgeAllocateMethod, cfg.method)
    ckpt = resolve_repo_path(m.checkpoint)
    layout, quotas, info = load_abridge_config(ckpt)
    if len(set(quotas)) != 1:
        raise SystemExit(
            f"{ckpt} was trained with a non-uniform schedule {quotas}: allocate from a uniform model (on the "
            "testbed the tiny default trains on the shipped schedule; a uniform one: python -m train +method=abridge "
            "method.schedule=null run_name=<name>, then method.checkpoint=runs/train/<name>/final)"
        )
    if level_counts(len(quotas)) == (0, 0):  # the schedule would be the uniform one it was trained with
        raise SettingsError(
            f"method.checkpoint={m.checkpoint}: a model of {len(quotas)} layer(s) cannot be allocated (a sixth of the "
            "layers at 2q and a third at q/2 needs at least 3 layers): the schedule would be its own uniform "
            f"{quotas}; use the checkpoint as it is"
        )
    three_level_schedule([0.0] * len(quotas), quotas[0])  # an unallocatable quota is refused before any work
    # a rerun on the same weights returns the finished allocation; retrained weights at that path are refused
    weights = {f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(ckpt.glob("*.safetensors"))}
    plan = prepare_run(cfg.run_dir, to_plain(cfg), cfg.resume, derived={"weights": weights}, title="allocation")
    if plan.finished:
        return plan.finished
    run_dir, logger = start_run(cfg, job_type="allocate")
    spec = model_spec(cfg)
    trained = ModelSpec(name=f"{spec.name}-abridge", arch=spec.arch, hf_id=str(ckpt), dtype=spec.dtype)
    device = pick_device(cfg.device)  # checked at the entry: auto, cpu, cuda or cuda:N this machine has
    model, tokenizer = (
        load_model(trained, cfg.cache_dir, device=device),
        load_tokenizer(trained, cfg.cache_dir),
    )
    n_heldout = m.heldout_examples if m.heldout_examples is not None else int(info["heldout_examples"])
    streams = load_streams(
        to_plain(cfg.data),
        tokenizer,
        layout,
        info["max_prompt_tokens"],
        info["max_response_tokens"],
        n_heldout,
    ).streams[:n_heldout]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    base_ce, costs = layer_costs(model, streams, quotas, pad_id, m.batch_size, m.mask_backend)
    schedule = three_level_schedule(costs, quotas[0])
    num_pause = pause_positions_needed(schedule, layout.num_pause)
    out = save_schedule(
        run_dir / "schedule.json",
        schedule,
        costs=costs,
        base_quota=quotas[0],
        base_heldout_ce=base_ce,
        checkpoint=str(ckpt),
        heldout_examples=n_heldout,
        num_pause=num_pause,
    )
    plot = plot_costs(run_dir / "layer_costs.png", costs, schedule, quotas[0])
    logger.table(
        "layer_costs",
        ["layer", "ce_increase", "quota"],
        [[i, c, q] for i, (c, q) in enumerate(zip(costs, schedule))],
    )
    logger.image("layer_costs", plot)
    from zoomr.rundir import write_summary

    summary = {
        "checkpoint": str(ckpt),
        "heldout": f"{n_heldout} examples, base CE {base_ce:.4f} at uniform quota {quotas[0]}",
        **{f"layer_{i}": f"{c:+.5f} nats -> quota {q}" for i, (c, q) in enumerate(zip(costs, schedule))},
        "schedule": f"{schedule} (mean {sum(schedule) / len(schedule):g})",
        "schedule_file": str(out),
        "plot": str(plot),
        "next": next_command(cfg.model.name, cfg.data.name, out, num_pause if num_pause != layout.num_pause else None),
    }
    write_summary(plan, summary, f"AbridgeKV allocation: {cfg.run_name}")
    logger.summary({  # the block above is text; W&B gets its numbers (allocate/base_heldout_ce, ...)
        "base_heldout_ce": base_ce, "base_quota": quotas[0], "schedule_mean": sum(schedule) / len(schedule),
        **{f"layer_{i}_ce_increase": c for i, c in enumerate(costs)},
        **{f"layer_{i}_quota": q for i, q in enumerate(schedule)},
    })  # fmt: skip
    logger.finish()
    return summary
