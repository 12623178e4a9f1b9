"""From-scratch training on the recall testbed (``+method=sft_testbed data=testbed model=tiny-testbed``).

A plain PyTorch loop over freshly generated problems (:mod:`zoomr.testbed.curriculum`), on the
project's model class (a tiny llama from :mod:`zoomr.models`), saved with ``save_pretrained`` so the
evaluator loads it with ``from_pretrained``. TRL's SFTTrainer (``+method=sft data=testbed`` also works)
has no curriculum or copy warm-up and recomputes chat templates per example; this loop is what meets
the time bar. Recipe (shared/specs/TESTBED_NOTES.md): AdamW β (0.9, 0.98), weight decay on matrices
only, warm-up then cosine to 10%, clip 1.0, ~8k tokens per step, embeddings initialised at std 0.02.
Loss on the positions the model writes at evaluation (the answers), never on the environment's tokens.
With summaries, an auxiliary summary-pointer loss (``method.summary_pointer_weight``, issue 13;
:func:`zoomr.summary_pointer.pointer_loss`) teaches the queries at each cue's boundary to score the
defining paragraph's summary highest with ZoomR's q · k̄_i, as a pretrained LLM's attention is tied to
its own summaries; the teacher-forced selection hit rate of the paper's rule is logged with the accuracy.
``method.summary_pointer_at_key`` adds the same loss at each cue's key token (the matching the boundary's
query then reuses); ``method.cue_view_window`` trains under ZoomR's decoding-time view at each cue's key and
boundary rows (:mod:`zoomr.testbed.cue_view`); ``method.init_from`` continues from a checkpoint (a second
stage: weights only).

Checkpoints (model, optimizer, step) go to ``<run_dir>/checkpoints/step-N``, every ``save_every`` steps and at the
last; ``resume=auto`` continues from the newest complete one (the batch stream is a function of the step, so a
resumed run sees the same data). A rerun goes through :func:`zoomr.rundir.prepare_run` like every trainer's: other
settings in a directory that holds trained state are refused, naming them, before anything is written; a finished
run prints its summary and returns; a larger ``method.max_steps`` continues it.
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import AutoConfig

from zoomr.entry import model_spec, start_run, to_plain
from zoomr.models import (
    ModelPathError,
    check_attention,
    checkpoint_dir_problem,
    describe,
    load_model,
    load_tokenizer,
    resolve_model_path,
)
from zoomr.paths import resolve_repo_path
from zoomr.rundir import (
    finish_run,
    prepare_run,
    torch_archive_whole,
    weights_problems,
    write_json,
    write_summary,
)
from zoomr.schemas import to_dataclass
from zoomr.schemas.checks import SettingsError
from zoomr.schemas.testbed import TestbedData, TestbedTrainMethod
from zoomr.summary_pointer import capture_qk, key_spread_penalty, pointer_loss, value_read_loss, with_key_cues
from zoomr.testbed import vocab as tt
from zoomr.testbed.checkpoint import finalize
from zoomr.testbed.cue_view import batch_cue_view, previous_selection
from zoomr.testbed.curriculum import Batch, Curriculum, check_lengths
from zoomr.testbed.task import validate as validate_data
from zoomr.testbed.teacher_forced import held_out_batches, teacher_forced_eval, token_kinds
from zoomr.testbed.vocab import check_tokenizer

log = logging.getLogger(__name__)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on weight matrices only; embeddings (tied with the head) and norms get none."""
    decay, no_decay = [], []
    emb = model.get_input_embeddings().weight
    for p in model.parameters():
        if not p.requires_grad:
            continue
        (decay if p.ndim >= 2 and p is not emb else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def init_weights(model: torch.nn.Module, method: TestbedTrainMethod) -> None:
    """Embeddings (tied with the head) ~ N(0, ``embedding_init_std``); with ``linear_init=torch`` every linear
    layer gets PyTorch's default Kaiming-uniform init (std 1/sqrt(3 fan_in), 0.051 at d=128) instead of the
    hub's N(0, 0.02), as in the feasibility recipe (shared/specs/TESTBED_NOTES.md)."""
    torch.nn.init.normal_(model.get_input_embeddings().weight, std=method.embedding_init_std)
    if method.linear_init == "torch":
        for m in model.modules():
            if isinstance(m, torch.nn.Linear) and m is not model.get_output_embeddings():
                m.reset_parameters()


def lr_at(step: int, m: TestbedTrainMethod) -> float:
    if step < m.warmup_steps:
        return m.learning_rate * (step + 1) / m.warmup_steps
    t = min(1.0, (step - m.warmup_steps) / max(1, m.max_steps - m.warmup_steps))
    return m.learning_rate * (m.min_lr_ratio + (1 - m.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * t)))


def training_mask(model, batch: Batch, method: TestbedTrainMethod, qk: dict | None, step: int) -> torch.Tensor | None:
    """The attention mask of a training forward: None (causal), or ZoomR's view at the cues (``cue_view_window``),
    from step ``cue_view_previous_selection_from`` on with what the selection at each cue's ``?`` keeps (the
    model's own votes, from a gradient-free forward under the plain cue view)."""
    if method.cue_view_window is None:
        return None
    mask = batch_cue_view(batch, method.cue_view_window)
    start = method.cue_view_previous_selection_from
    if mask is None or start is None or step < start:
        return mask
    with torch.no_grad():
        model(input_ids=batch.input_ids, attention_mask=mask)
    return batch_cue_view(batch, method.cue_view_window, previous_selection(qk, batch))


def batch_loss(model, batch: Batch, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean CE over labelled positions, logits), under ``mask`` if given."""
    logits = model(input_ids=batch.input_ids, attention_mask=mask).logits
    return F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=-100), logits


def pointer_layers(n: int, method: TestbedTrainMethod) -> list[int]:
    """The layers (of ``n``) the summary-pointer loss trains (default: all but the first)."""
    layers = list(range(1, n)) if method.summary_pointer_layers is None else list(method.summary_pointer_layers)
    if any(not 0 <= i < n for i in layers):
        raise SettingsError(f"method.summary_pointer_layers={layers}: the model has layers 0..{n - 1}")
    return layers


CHECKPOINT_PREFIX = "step-"
# method keys that say how a run logs, evaluates, saves or is scheduled, not what it trains: a rerun may change them
FREE_KEYS = ("threads", "log_every", "eval_every", "eval_examples", "save_every", "max_seconds")


def checkpoint_problems(ckpt: Path) -> list[str]:
    """Why a ``step-N`` checkpoint cannot be resumed from (empty: it can): whole weights, a config and a whole
    ``trainer_state.pt`` (written last)."""
    out = weights_problems(ckpt)
    if not (ckpt / "config.json").is_file():
        out.append("config.json is missing")
    if not torch_archive_whole(ckpt / "trainer_state.pt"):
        out.append("trainer_state.pt (written last) is missing or truncated")
    return out


def save_checkpoint(
    model, tokenizer, opt, step: int, elapsed: float, ckpt_dir: Path, seen: int = 0, history: list | None = None,
    losses: dict[str, Any] | None = None,
) -> None:
    """``seen`` (tokens trained on), ``history`` (the held-out evaluations so far) and ``losses`` (:class:`Losses`)
    go into ``trainer_state.pt`` with the step, so a resumed run's summary and ``eval_history.json`` cover the whole
    run."""
    out = ckpt_dir / f"{CHECKPOINT_PREFIX}{step}"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    state = {"optimizer": opt.state_dict(), "step": step, "elapsed": elapsed, "seen": seen, "history": history or []}
    if losses is not None:
        state["losses"] = losses
    torch.save(state, out / "trainer_state.pt")
    for old in sorted(ckpt_dir.glob(f"{CHECKPOINT_PREFIX}*"), key=lambda p: int(p.name.split("-")[1]))[:-2]:
        for f in sorted(old.rglob("*"), reverse=True):
            f.unlink() if f.is_file() else f.rmdir()
        old.rmdir()


def check_method(method: TestbedTrainMethod, data: TestbedData) -> None:
    """Refuse settings that cannot work with this data, before any state is written (ranges: the schema)."""
    validate_data(data)  # the task's own ranges (e.g. traces too short for a paragraph and the answer)
    check_lengths(data, method.curriculum)  # and the curriculum's shortest traces
    if method.summary_pointer_at_key and (not data.summaries or data.query_form != "cue"):
        raise SettingsError("method.summary_pointer_at_key needs data with summaries and query_form=cue (a key before ':')")
    if method.cue_view_previous_selection_from is not None and method.cue_view_window is None:
        raise SettingsError("method.cue_view_previous_selection_from needs method.cue_view_window")
    if method.cue_view_window is not None and (not data.summaries or data.query_form != "cue"):
        raise SettingsError(f"method.cue_view_window={method.cue_view_window}: needs data with summaries and query_form=cue")
    if method.value_read_weight > 0 and (not data.summaries or data.query_form != "cue"):
        raise SettingsError(f"method.value_read_weight={method.value_read_weight}: > 0 needs data with summaries and query_form=cue")
    if method.init_from and (problem := checkpoint_dir_problem(resolve_repo_path(method.init_from))):
        raise ModelPathError(f"method.init_from={method.init_from}: {problem}")
    if method.warmup_steps >= method.max_steps:  # legitimate in a short trial run, so said, not refused
        log.warning("method.warmup_steps=%d >= method.max_steps=%d: the whole run is in the warm-up (the learning rate "
                    "rises all along and never decays)", method.warmup_steps, method.max_steps)


@dataclass
class Losses:
    """The training loss of every step, as the other trainers' summaries give it (``loss_start``, ``loss_end``,
    ``train_loss`` the whole-run mean per step); kept in each checkpoint, so a resumed run's figures cover the
    steps before the resume. ``since``: the first step counted (a checkpoint written before these were kept gives
    only the steps after it)."""

    first: float | None = None
    last: float | None = None
    total: float = 0.0
    since: int = 0

    def add(self, loss: float) -> None:
        self.first = loss if self.first is None else self.first
        self.last, self.total = loss, self.total + loss

    def summary(self, steps: int) -> dict[str, float]:
        if self.first is None:
            return {}
        mean = self.total / max(1, steps - self.since)
        return {"loss_start": round(self.first, 4), "loss_end": round(self.last, 4), "train_loss": round(mean, 4)}


def train_keys(metrics: dict[str, Any]) -> dict[str, float]:
    """W&B history keys under the run's job type, ``train/loss`` like the other trainers' (``tf_*`` then share their
    keys with the summary's ``train/tf_*``, where unprefixed they showed up twice)."""
    return {f"train/{k}": v for k, v in metrics.items()}


def run(cfg) -> dict[str, Any]:
    method: TestbedTrainMethod = to_dataclass(TestbedTrainMethod, cfg.method)
    data: TestbedData = to_dataclass(TestbedData, cfg.data)
    if method.threads:
        torch.set_num_threads(method.threads)
    check_method(method, data)
    spec = model_spec(cfg)
    if method.init_from:  # a second stage: the checkpoint's weights (and tokenizer), not a fresh init
        spec = replace(spec, hf_id=str(resolve_repo_path(method.init_from)))
    tokenizer = load_tokenizer(spec, cfg.cache_dir)
    check_tokenizer(tokenizer)  # a model without the testbed's words is refused before any state is written
    layers = pointer_layers(AutoConfig.from_pretrained(resolve_model_path(spec, cfg.cache_dir)).num_hidden_layers, method)
    check_attention(spec.attn_implementation)  # the model loads after the run state is written
    if str(cfg.get("device") or "auto").startswith("cuda"):  # it trains where load_model puts the model: the CPU
        raise SettingsError(f"device={cfg.device}: the testbed trainer (+method={cfg.method.name}) trains on the CPU; "
                            "leave device=auto or give device=cpu")  # fmt: skip
    plan = prepare_run(cfg.run_dir, to_plain(cfg), cfg.resume, free=FREE_KEYS, checkpoint_problems=checkpoint_problems,
                       title="testbed training", checkpoint_prefix=CHECKPOINT_PREFIX)  # fmt: skip
    if plan.finished:
        return plan.finished
    run_dir, logger = start_run(cfg, job_type="train")
    torch.manual_seed(cfg.seed)
    model = load_model(spec, cfg.cache_dir).train()
    if not method.init_from:
        init_weights(model, method)
    opt = torch.optim.AdamW(param_groups(model, method.weight_decay), lr=method.learning_rate, betas=tuple(method.betas))
    enc = tt.FastEncoder(tokenizer)
    stream = Curriculum(data, method.curriculum, method.max_steps, method.tokens_per_step, enc)
    held_out = held_out_batches(data, method.eval_examples, enc, stream.pad_id)
    kinds = token_kinds(tokenizer)
    ckpt_dir = run_dir / "checkpoints"
    start, prior, seen, history, losses = 0, 0.0, 0, [], Losses()
    resume = Path(plan.resume_from) if plan.resume_from else None
    if resume is not None:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(resume, dtype=torch.float32).train()
        opt = torch.optim.AdamW(param_groups(model, method.weight_decay), lr=method.learning_rate, betas=tuple(method.betas))
        state = torch.load(resume / "trainer_state.pt", weights_only=True)  # tensors and plain values only
        opt.load_state_dict(state["optimizer"])
        start, prior = state["step"], state["elapsed"]
        seen, history = state.get("seen", 0), state.get("history", [])  # absent in older checkpoints
        losses = Losses(**state["losses"]) if "losses" in state else Losses(since=start)
        log.info("resumed from %s (step %d)", resume, start)

    t0, seen_before = time.time(), seen
    steps_done, stopped_early = start, False
    use_pointer = data.summaries and method.summary_pointer_weight > 0
    key_ids = [tokenizer.convert_tokens_to_ids(tt.key(i)) for i in range(tt.N_KEYS)]
    capture = capture_qk(model) if data.summaries else nullcontext()
    qk = capture.__enter__()
    device = next(model.parameters()).device.type
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=method.autocast_bf16)  # reusable: one per step
    bar = tqdm(range(start, method.max_steps), desc="testbed train", initial=start, total=method.max_steps)
    for step in bar:
        batch = stream.batch(step)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, method)
        with autocast:
            loss, _ = batch_loss(model, batch, training_mask(model, batch, method, qk, step))
            cues = with_key_cues(batch.cues) if method.summary_pointer_at_key and batch.cues else batch.cues
            aux = pointer_loss(qk, batch.spans, cues, layers, method.summary_pointer_margin) if use_pointer and cues else None
            if aux is not None:
                loss = loss + method.summary_pointer_weight * aux
            spread = None
            if method.key_spread_weight > 0:
                spread = key_spread_penalty(model.get_input_embeddings().weight, key_ids)
                loss = loss + method.key_spread_weight * spread
            read = None
            if method.value_read_weight > 0 and batch.cues:
                read = value_read_loss(qk, batch.input_ids, batch.starts, batch.cues, layers)
                if read is not None:
                    loss = loss + method.value_read_weight * read
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), method.max_grad_norm)
        if not (torch.isfinite(loss) and torch.isfinite(norm)):  # before the step: the weights are still finite
            raise SystemExit(
                f"training diverged: loss {loss.item()}, grad_norm {norm.item()} at step {step + 1}; stopped before "
                f"that step (the checkpoints before it in {ckpt_dir} are kept). Lower method.learning_rate (or "
                "method.max_grad_norm), or check that the start model's weights are finite"
            )
        opt.step()
        losses.add(loss.item())
        seen += batch.tokens
        steps_done = step + 1
        elapsed = prior + time.time() - t0
        if step % method.log_every == 0:
            rate = (seen - seen_before) / max(1e-9, time.time() - t0)
            extra = {"pointer_loss": aux.item()} if aux is not None else {}
            if spread is not None:
                extra["key_spread"] = spread.item()
            if read is not None:
                extra["value_read"] = read.item()
            bar.set_postfix(loss=f"{loss.item():.3f}", len=batch.trace_tokens, tok_s=f"{rate:.0f}")
            logger.log(train_keys({"loss": loss.item(), "lr": opt.param_groups[0]["lr"], "trace_tokens": batch.trace_tokens, "tokens_per_s": rate, **extra}), step=step)
        if (step + 1) % method.eval_every == 0 or step + 1 == method.max_steps:
            ev = teacher_forced_eval(model, held_out, kinds, qk if data.summaries else None, method.cue_view_window)
            history.append({"step": step + 1, "seconds": round(elapsed, 1), "tokens": seen, **ev})
            logger.log(train_keys(ev), step=step)
            tqdm.write(f"step {step + 1}: {elapsed:.0f}s " + " ".join(f"{k}={v:.3f}" for k, v in ev.items()))
        stopped_early = bool(method.max_seconds and elapsed >= method.max_seconds and step + 1 < method.max_steps)
        if (step + 1) % method.save_every == 0 or step + 1 == method.max_steps or stopped_early:
            save_checkpoint(model, tokenizer, opt, step + 1, elapsed, ckpt_dir, seen, history, asdict(losses))
        if stopped_early:
            tqdm.write(f"stopping at step {step + 1}: max_seconds={method.max_seconds} reached (a rerun continues)")
            break
    capture.__exit__(None, None, None)
    wall = prior + time.time() - t0
    final_dir = run_dir / "final"
    finalize(model, tokenizer, data, final_dir)
    last = history[-1] if history else teacher_forced_eval(model, held_out)
    summary = {
        "method": method.name,
        "model": f"{spec.name} ({describe(model)['params']:,} params)",
        "data": f"{data.name} trace_tokens={data.trace_tokens} summaries={data.summaries}"
        + (" paragraph_topics=True" if data.paragraph_topics else ""),
        "steps": steps_done,
        "tokens_seen": seen,
        "seconds": round(wall, 1),
        "tokens_per_s": round((seen - seen_before) / max(1e-9, time.time() - t0)),  # this process's
        "threads": torch.get_num_threads(),
        **losses.summary(steps_done),  # the training loss, as the other trainers report it (there was none)
        **{k: round(v, 4) for k, v in last.items() if k.startswith("tf_")},
        "resumed_from": str(resume) if resume else "-",
        "checkpoint": str(final_dir),
        "run_dir": str(run_dir),
    }
    write_json(run_dir / "eval_history.json", history)
    title = f"testbed training finished: {cfg.run_name}"
    if stopped_early:  # a summary, but not recorded as finished: a rerun continues from the last checkpoint
        write_summary(run_dir, summary, title + f" (stopped at step {steps_done} by method.max_seconds)")
        logger.summary({k: v for k, v in summary.items() if isinstance(v, int | float)})  # W&B's, as summary.json's
        logger.finish()
        return summary
    return finish_run(plan, logger, summary, title)


