"""AbridgeKV block-masked full fine-tuning (``python -m train +method=abridge``; AbridgeKV §3, appendix "training").

One forward pass per batch over prompt + interleaved response/pause tokens, each layer under its own
quota's block mask; next-token CE on every response token, none on pause tokens, no auxiliary terms.
The HF ``Trainer`` supplies the loop, AdamW (β, weight decay, clipping from ``method.optim``),
DeepSpeed (``deepspeed=zero2|zero3``), checkpoints (``<run_dir>/checkpoints``, ``resume=auto``) and
the progress bar; :mod:`zoomr.abridge.trainer` the loss, the collator and the paper's LR schedule.
The run ends with held-out CE under compression and with the full history, and a summary table.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from zoomr.abridge.artifacts import save_abridge_config
from zoomr.abridge.attention import use_abridge_attention
from zoomr.abridge.forward import heldout_ce, heldout_full_kv_ce
from zoomr.abridge.layout import PAUSE, AbridgeLayout, add_pause_tokens
from zoomr.abridge.quotas import resolve_quotas
from zoomr.abridge.trainer import (
    AbridgeTrainer,
    check_heldout_setting,
    check_loop,
    load_start_model,
    load_streams,
    masked_trainer,
    save_final,
)
from zoomr.cache.abridge import AbridgeMethod
from zoomr.entry import model_spec, pick_device, start_run, to_plain
from zoomr.models import DTYPES
from zoomr.paths import resolve_repo_path
from zoomr.rundir import finish_run, prepare_run, started_from
from zoomr.schemas import to_dataclass
from zoomr.schemas.checks import SettingsError
from zoomr.training import check_data_source, train_or_restore

log = logging.getLogger(__name__)
TESTBED_LOADER = "zoomr.testbed.task"  # the data.loader of data=testbed


def run(cfg) -> dict[str, Any]:
    m: AbridgeMethod = to_dataclass(AbridgeMethod, cfg.method)
    spec = model_spec(cfg)
    check_data_source(to_plain(cfg.data))
    check_heldout_setting(to_plain(cfg.data))
    layout = AbridgeLayout(m.block_size, m.num_pause, m.code_positions)
    device = pick_device(cfg.device)  # checked at the entry: auto, cpu, cuda or cuda:N this machine has
    model, tokenizer = load_start_model(spec, m, cfg.cache_dir, device)
    try:  # a schedule for another depth, or quotas above K: the user's settings, refused by name
        quotas = resolve_quotas(model.config.num_hidden_layers, layout.num_pause, m.quota, m.schedule)
    except ValueError as e:
        raise SettingsError(f"method.schedule={m.schedule} / method.quota={m.quota}: {e}") from None
    added = add_pause_tokens(model, tokenizer, layout.num_pause)
    streams = load_streams(  # data that cannot train (responses over max_response_tokens, too few rows): refused here
        to_plain(cfg.data), tokenizer, layout, m.max_prompt_tokens, m.max_response_tokens, m.heldout_examples
    )
    if layout.block_size > m.max_response_tokens:  # every block would stay open: no pause rows, nothing learned
        raise SettingsError(
            f"method.block_size={layout.block_size} exceeds method.max_response_tokens={m.max_response_tokens}: no "
            "response completes a block, so no pause token is ever inserted and the model would train as full KV"
        )
    if not blocks_complete(streams, m.heldout_examples):  # responses all within one block: the same, from the data
        raise SettingsError(
            f"{streams.describe()}: no training response is longer than method.block_size={layout.block_size} "
            "tokens, so no block completes, no pause token is ever inserted and the model would train as full KV; "
            "lower method.block_size or train on longer responses"
        )
    deepspeed = to_plain(cfg.deepspeed.config) if cfg.deepspeed.config else None
    check_loop(m, device, Path(cfg.run_dir) / "checkpoints", cfg.seed, deepspeed)
    # the guard compares the resolved quotas too (a schedule file may change under the same name)
    plan = prepare_run(cfg.run_dir, to_plain(cfg), cfg.resume, derived={"quotas": quotas}, title="AbridgeKV training")
    if plan.finished:
        return plan.finished
    run_dir, logger = start_run(cfg, job_type="train")
    save_abridge_config(run_dir, layout, quotas)
    heldout, train_set = streams.streams[: m.heldout_examples], streams.streams[m.heldout_examples :]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    log.info("AbridgeKV %s, quotas %s; %s", layout, quotas, streams.describe())

    model.train()
    use_abridge_attention(model)
    ckpt_dir = run_dir / "checkpoints"
    trainer = masked_trainer(
        AbridgeTrainer, m, model, tokenizer, (train_set, heldout), ckpt_dir, cfg.seed,
        ["wandb"] if logger.enabled else [], deepspeed,
        quotas=quotas,
    )
    elapsed = train_or_restore(trainer, plan, m.max_steps)

    model, final_dir = save_final(trainer, spec, tokenizer, run_dir, to_plain(cfg.data))
    save_abridge_config(
        final_dir,
        layout,
        quotas,
        heldout_examples=m.heldout_examples,
        max_prompt_tokens=m.max_prompt_tokens,
        max_response_tokens=m.max_response_tokens,
        data=cfg.data.name,
    )
    ce_abridge = heldout_ce(model, heldout, quotas, pad_id, m.per_device_batch_size, m.mask_backend)
    ce_full = heldout_full_kv_ce(model, heldout, pad_id)
    summary = summarize(cfg, m, layout, quotas, streams, trainer, elapsed, plan.resume_from, added)
    summary |= {
        "heldout_ce_abridge": round(ce_abridge, 4),
        "heldout_ce_full_kv": round(ce_full, 4),
        **testbed_comparison(to_plain(cfg.data), m, final_dir, run_dir / "testbed_eval"),
        "checkpoint": str(final_dir),
        "run_dir": str(run_dir),
    }
    return finish_run(plan, logger, summary, f"AbridgeKV training finished: {cfg.run_name}")


def blocks_complete(streams, heldout: int, sample: int = 16) -> bool:
    """Whether some training stream (past the ``heldout`` first; the first ``sample`` of a lazily built set, each
    generated on access) holds pause tokens: a response that completes a block and goes on."""
    train = streams.streams[heldout:]
    seen = train if isinstance(train, list) else train[:sample]
    return any(PAUSE in s.kind for s in seen)


def uncompressed_start(path: Path) -> Path:
    """The first checkpoint up the ``method.init_from`` chain that is not itself an AbridgeKV model (a second
    training stage starts from one, whose weights no longer work uncompressed): full KV's model."""
    while (path / "abridge.json").exists() and (start := started_from(path)) is not None:
        path = start
    return path


def testbed_comparison(data: dict[str, Any], m: AbridgeMethod, final_dir: Path, out: Path) -> dict[str, Any]:
    """On the recall testbed: held-out greedy answer accuracy of this AbridgeKV model, of full KV (the
    model it started from) and of StreamingLLM on that model at this model's mean resident rows, each run
    by the evaluator (``out/<arm>``, resumable); a table for the console, the figures for summary.json."""
    if data.get("loader") != TESTBED_LOADER or not m.testbed_eval_problems or not m.init_from:
        return {}
    from eval.arms import run_arm, testbed_command

    fields = ("trace_tokens", "summaries", "model_writes_summaries", "query_form", "test_seed")
    opts = {k: data[k] for k in fields if k in data} | {"n_test": m.testbed_eval_problems}
    threads = torch.get_num_threads()
    start = uncompressed_start(resolve_repo_path(m.init_from))

    def arm(name: str, ckpt: Path, method: list[str] | None = None):
        return run_arm(testbed_command(ckpt, out / name, opts, method), out / name, threads)

    abridge = arm("abridge", final_dir, ["+method=abridge"])
    full = arm("full", start)
    rows = round(float(abridge.rows.mean()))
    streaming = arm("streaming", start, ["+method=streaming", f"method.budget_rows={rows}"])
    ratio = float(full.rows.mean() / abridge.rows.mean())
    table = [
        f"held-out testbed problems: {opts['n_test']} (test seed {opts.get('test_seed', 'default')}), greedy",
        f"{'arm':<34}{'answer acc':>11}{'recall':>8}{'KV rows':>9}",
        *(
            f"{name:<34}{r.accuracy:>11.3f}{float(r.recall.mean()):>8.3f}{float(r.rows.mean()):>9.0f}"
            for name, r in (("full KV (start model)", full), ("AbridgeKV (this model)", abridge),
                            (f"StreamingLLM at {rows} rows", streaming))
        ),
        f"resident KV: full / AbridgeKV = {ratio:.2f}x",
    ]  # fmt: skip
    print("\n" + "\n".join(table), flush=True)
    return {
        "testbed_problems": opts["n_test"],
        "testbed_answer_acc_abridge": round(abridge.accuracy, 4),
        "testbed_answer_acc_full_kv": round(full.accuracy, 4),
        "testbed_answer_acc_streaming_at_abridge_rows": round(streaming.accuracy, 4),
        "testbed_recall_abridge": round(float(abridge.recall.mean()), 4),
        "testbed_kv_rows_full_over_abridge": round(ratio, 3),
    }


def summarize(cfg, m, layout, quotas, streams, trainer, elapsed, resume, added) -> dict[str, Any]:
    from zoomr.training import training_losses

    mean_q = sum(quotas) / len(quotas)
    return {
        "method": m.name,
        "model": f"{cfg.model.name} ({DTYPES[cfg.model.dtype]})",
        "data": f"{cfg.data.name}: {streams.describe()}; {m.heldout_examples} held out",
        "layout": f"C={layout.block_size} K={layout.num_pause} positions={layout.code_positions}",
        "quotas": f"{quotas} (mean {mean_q:g}; block ratio C/q = {layout.block_size / mean_q:.2f}:1)"
        if mean_q
        else str(quotas),
        "pause_tokens_added": added,
        "mask_backend": m.mask_backend,
        "resumed_from": resume or "-",
        **training_losses(trainer),
        "seconds": round(elapsed, 1),
    }
