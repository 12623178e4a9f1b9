"""Training run directories: what a rerun of the same command does (issue 18).

Every trainer calls :func:`prepare_run` *before* it writes anything, then :meth:`RunPlan.finish` at the end:

- **settings guard**: ``settings.json`` records what the weights depend on (the resolved config without the
  keys that only say where to write or how often to log/save, plus trainer-derived values such as AbridgeKV's
  quotas). A rerun into a directory that holds trained state with other settings is refused, naming every
  differing key, before any file is touched;
- **already finished**: a rerun of a finished run (same settings, same length) prints its summary and returns
  it: no training, no file rewritten;
- **resume**: the newest *complete* checkpoint (``resume=auto``); an incomplete one (a kill while saving) is
  moved aside to ``incomplete-<name>`` with the reason logged. ``max_steps``/``epochs`` may grow between runs
  (the run continues); fewer steps than already trained is refused;
- ``resume=never`` moves the previous run's state to ``replaced-<n>/`` and starts over (nothing is deleted);
- **one writer**: the trainer holds ``<run_dir>/.lock`` from the check on (:mod:`zoomr.runlock`), so a second
  training of the same directory is refused while the first runs (it resumed from the first one's checkpoints).

A Hugging Face ``Trainer`` checkpoint is written in this order (``Trainer._save_checkpoint``): the model
(weights, config, tokenizer, ``training_args.bin``), ``optimizer.pt``, ``scheduler.pt``, ``rng_state*.pth``, and
``trainer_state.json`` last. It is complete when ``trainer_state.json`` parses and names its step, the weights
are whole (safetensors header and size, every shard of an index) and the optimizer/scheduler archives are whole
(or the DeepSpeed ``global_step<N>`` directory exists).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zoomr.paths import FULL_OR_READ_ONLY, OutputUnwritable
from zoomr.runlock import hold_run_lock

log = logging.getLogger(__name__)

SETTINGS_FILE = "settings.json"
SUMMARY_FILE = "summary.json"
CHECKPOINTS = "checkpoints"
CHECKPOINT_PREFIX = "checkpoint-"
# top-level config keys that say where a run writes and how it is logged, not what it trains
RUN_KEYS = frozenset({"run_name", "run_dir", "resume", "logger", "cache_dir", "device", "hydra"})
# method keys that change how often things are logged, evaluated or saved (or recomputed), not the weights
CADENCE_KEYS = frozenset({"logging_steps", "save_steps", "save_total_limit", "eval_steps", "gradient_checkpointing"})
# method keys that say how long to train: a rerun may extend a run
EXTENT_KEYS = ("max_steps", "epochs")
WEIGHT_FILES = ("model.safetensors", "adapter_model.safetensors", "pytorch_model.bin", "adapter_model.bin")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


@dataclass
class RunPlan:
    """What a trainer does in ``run_dir``: resume from ``resume_from`` (or start fresh), or nothing at all when
    ``finished`` holds the summary of a run that already finished with these settings."""

    run_dir: Path
    extent: dict[str, Any]
    resume_from: str | None = None
    finished: dict[str, Any] | None = None
    extended: bool = False  # the length asked for differs from the last run's

    def needs_training(self, max_steps: int | None = None) -> bool:
        """False when ``resume_from`` already holds the last step (a kill after the final checkpoint, before the
        summary): the trainer then restores it instead of training (the HF loop would step past the end)."""
        if self.resume_from is None:
            return True
        state = read_json(Path(self.resume_from) / "trainer_state.json") or {}
        step = int(state.get("global_step", step_of(self.resume_from)))
        if max_steps is not None and max_steps > 0:
            return step < max_steps
        return self.extended or step < int(state.get("max_steps") or 0)

    def finish(self, summary: dict[str, Any]) -> None:
        """Write ``summary.json`` (atomically, so a kill leaves the old one or the new one) and record that the
        run finished at this length."""
        write_json(self.run_dir / SUMMARY_FILE, summary)
        record = read_json(self.run_dir / SETTINGS_FILE) or {}
        write_json(self.run_dir / SETTINGS_FILE, {**record, "finished": self.extent})


def prepare_run(
    run_dir: str | Path,
    config: dict[str, Any],
    resume: str = "auto",
    *,
    derived: dict[str, Any] | None = None,
    free: Iterable[str] = (),
    checkpoint_problems: Callable[[Path], list[str]] | None = None,
    title: str = "training",
    checkpoint_prefix: str = CHECKPOINT_PREFIX,
) -> RunPlan:
    """Check a (re)run against what ``run_dir`` holds before anything is written; see the module docstring.

    ``config``: the resolved config as plain containers; ``derived``: values a trainer computes from it that
    the weights depend on (JSON-able); ``free``: extra method keys a rerun may change; ``checkpoint_problems``:
    what makes a checkpoint incomplete (default :func:`hf_checkpoint_problems`); ``title`` names the run in
    the "already finished" message; ``checkpoint_prefix``: the checkpoint directories' names before the step.
    """
    run_dir = Path(run_dir)
    if is_main_process() and run_dir.is_dir():  # another training may be writing it: refused before any check
        hold_run_lock(run_dir)  # (rank 0 writes the directory; a second job's rank 0 is refused here)
    problems = checkpoint_problems or hf_checkpoint_problems
    settings = training_settings(config, derived, free)
    extent = {k: (config.get("method") or {}).get(k) for k in EXTENT_KEYS}
    plan = RunPlan(run_dir, extent)
    record = read_json(run_dir / SETTINGS_FILE)
    if resume == "never":
        set_aside(run_dir)
        record = None
    elif holds_state(run_dir, checkpoint_prefix):
        old = record.get("settings") if record else settings_from_config(run_dir, derived, free)
        if old is None:  # a checkpoint put there by hand (no settings.json, no config.json): never train over it
            raise SystemExit(
                f"{run_dir} holds a trained model ({', '.join(state_names(run_dir, checkpoint_prefix))}) but no record "
                "of the settings that made it (no settings.json or config.json), so it cannot be resumed or checked: "
                "pick another run_name=… (or resume=never to move it aside and start over there)"
            )
        refuse_changes(run_dir, old, settings)
        summary = read_json(run_dir / SUMMARY_FILE)
        finished = record.get("finished") if record else legacy_extent(run_dir, summary)
        if finished == extent and summary is not None:
            longer = "; a larger method.max_steps continues it" if extent.get("max_steps") else ""
            note = f"another run_name=… starts a new run{longer}"
            print(format_block(summary, f"{title} already finished: {run_dir} ({note})"), flush=True)
            plan.finished = summary
            return plan
        check_extent(run_dir, extent, finished)
        plan.resume_from = pick_resume(run_dir / CHECKPOINTS, resume, problems, checkpoint_prefix)
        if plan.resume_from is None and summary is not None:
            raise SystemExit(
                f"{run_dir} holds a finished run but no complete checkpoint to continue from: pick another "
                "run_name=… (or resume=never to start over there)"
            )
        plan.extended = record is not None and record.get("extent") != extent
    elif resume != "auto":
        plan.resume_from = pick_resume(run_dir / CHECKPOINTS, resume, problems, checkpoint_prefix)
    if plan.resume_from and (extent.get("max_steps") or 0) > 0 and step_of(plan.resume_from) > extent["max_steps"]:
        raise SystemExit(
            f"{plan.resume_from} is past method.max_steps={extent['max_steps']}: ask for at least "
            f"{step_of(plan.resume_from)} steps, or pick another run_name=…"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    if is_main_process():  # a new directory: two runs that both found it missing, the second is refused here
        hold_run_lock(run_dir)
    kept = {"finished": record["finished"]} if record and "finished" in record else {}
    write_json(run_dir / SETTINGS_FILE, {"settings": settings, "extent": extent, **kept})
    return plan


# ---- settings -------------------------------------------------------------------------------------------


def training_settings(
    config: dict[str, Any], derived: dict[str, Any] | None = None, free: Iterable[str] = ()
) -> dict[str, Any]:
    """Flat ``{"a.b": value}`` of everything in ``config`` the weights depend on, plus ``derived.*``."""
    skip_method = CADENCE_KEYS | set(EXTENT_KEYS) | set(free)
    kept = {k: v for k, v in config.items() if k not in RUN_KEYS}
    if isinstance(kept.get("method"), dict):
        kept["method"] = {k: v for k, v in kept["method"].items() if k not in skip_method}
    if derived:
        kept["derived"] = derived
    return json.loads(json.dumps(flatten(kept), default=str))


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        if isinstance(v, dict) and v:
            out |= flatten(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def changed_settings(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``key: was …, now …`` for every key whose value differs (absent = ``None``)."""
    return [
        f"{k}: was {old.get(k)!r}, now {new.get(k)!r}"
        for k in sorted(set(old) | set(new))
        if old.get(k) != new.get(k)
    ]


def refuse_changes(run_dir: Path, old: dict[str, Any], new: dict[str, Any]) -> None:
    diffs = changed_settings(old, new)
    if diffs:
        shown = "\n  ".join(diffs[:20]) + (f"\n  … and {len(diffs) - 20} more" if len(diffs) > 20 else "")
        raise SystemExit(
            f"{run_dir} holds a run trained with other settings:\n  {shown}\n"
            "Pick another run_name=… to keep both, or resume=never to start over there "
            "(the old run is moved to replaced-<n>/)."
        )


def settings_from_config(run_dir: Path, derived: dict[str, Any] | None, free: Iterable[str]) -> dict | None:
    """The settings of a run directory written before ``settings.json`` existed (from its ``config.json``)."""
    config = read_json(run_dir / "config.json")
    return None if config is None else training_settings(config, derived, free)


def legacy_extent(run_dir: Path, summary: dict | None) -> dict[str, Any] | None:
    """The length a run written before ``settings.json`` finished at: its ``config.json``'s, if it has a summary."""
    config = read_json(run_dir / "config.json") if summary is not None else None
    return None if config is None else {k: (config.get("method") or {}).get(k) for k in EXTENT_KEYS}


def check_extent(run_dir: Path, extent: dict[str, Any], finished: dict[str, Any] | None) -> None:
    if not finished:
        return
    old, new = finished.get("max_steps") or 0, extent.get("max_steps") or 0
    if old > 0 and 0 < new < old:
        raise SystemExit(
            f"{run_dir} finished {old} steps already; method.max_steps={new} asks for fewer: pick another "
            "run_name=… (or resume=never to start over there)"
        )


# ---- run-directory state --------------------------------------------------------------------------------


def state_names(run_dir: Path, checkpoint_prefix: str = CHECKPOINT_PREFIX) -> list[str]:
    """What ``run_dir`` holds that was trained: a summary, ``final/``, checkpoints."""
    ckpts = run_dir / CHECKPOINTS
    names = [n for n in (SUMMARY_FILE, "final") if (run_dir / n).exists()]
    return names + ([f"{CHECKPOINTS}/"] if ckpts.is_dir() and any(ckpts.glob(f"{checkpoint_prefix}*")) else [])


def holds_state(run_dir: Path, checkpoint_prefix: str = CHECKPOINT_PREFIX) -> bool:
    """Whether ``run_dir`` holds anything trained: a checkpoint, ``final/`` or a summary."""
    return bool(state_names(run_dir, checkpoint_prefix))


def set_aside(run_dir: Path) -> Path | None:
    """``resume=never``: move the previous run's state to ``replaced-<n>/`` (so no stale checkpoint is resumed
    later, and nothing is lost)."""
    names = [SUMMARY_FILE, SETTINGS_FILE, "final", CHECKPOINTS]
    present = [run_dir / n for n in names if (run_dir / n).exists()]
    if not present or not holds_state(run_dir) or not is_main_process():
        return None
    dest = free_name(run_dir, "replaced")
    dest.mkdir()
    for p in present:
        p.rename(dest / p.name)
    log.warning("resume=never: moved the previous run's %s to %s", ", ".join(p.name for p in present), dest)
    return dest


def free_name(parent: Path, stem: str) -> Path:
    n = 1
    while (parent / f"{stem}-{n}").exists():
        n += 1
    return parent / f"{stem}-{n}"


def started_from(checkpoint: str | Path) -> Path | None:
    """The checkpoint the run that saved ``checkpoint`` (its ``final/``) was fine-tuned from: ``method.init_from``
    in the run directory's ``config.json``; None for a model trained from scratch or with nothing recorded."""
    from zoomr.paths import resolve_repo_path

    config = read_json(Path(checkpoint).parent / "config.json")
    method = config.get("method") if isinstance(config, dict) else None
    start = method.get("init_from") if isinstance(method, dict) else None
    return resolve_repo_path(start) if isinstance(start, str) and start else None


def read_json(path: Path) -> Any:
    """The parsed file, or ``None`` when it is absent or torn."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def write_json(path: Path, obj: Any) -> None:
    """Write through a temporary file and rename, so a kill leaves the old file or the new one (and a full disk
    too: :func:`replace_file`)."""
    text = json.dumps(obj, indent=2, default=str)
    replace_file(Path(path), lambda tmp: tmp.write_text(text))


def replace_file(path: Path, write: Callable[[Path], Any]) -> None:
    """``write(tmp)`` to a temporary name beside ``path``, then rename it over ``path``: a kill leaves the old file
    or the new one, never a torn one (tables, figures: anything a writer can be given a path for). A full disk or
    a read-only file system is :class:`~zoomr.paths.OutputUnwritable` naming ``path`` (it was ``OSError: [Errno 28]
    No space left on device`` without a path, and ``write_json`` left its torn temporary file behind)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # one per process: ranks may write at once
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno in FULL_OR_READ_ONLY:
            raise OutputUnwritable(f"{path} cannot be written ({e.strerror}); the file there before is kept") from e
        raise


def write_text_atomic(path: Path, text: str, newline: str | None = None) -> None:
    """``text`` into ``path`` through :func:`replace_file` (``newline=""`` for csv text, as ``open`` takes it)."""

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline=newline) as f:
            f.write(text)

    replace_file(path, write)


def format_block(summary: dict[str, Any], title: str) -> str:
    """A readable ``key  value`` block under a title (the end-of-run summary every trainer prints)."""
    width = max((len(k) for k in summary), default=0)
    return "\n".join([f"== {title} ==", *(f"{k:<{width}}  {_fmt(v)}" for k, v in summary.items())])


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


# ---- checkpoints ----------------------------------------------------------------------------------------


def step_of(checkpoint: str | Path) -> int:
    name = Path(checkpoint).name
    digits = name.rsplit("-", 1)[-1]
    return int(digits) if digits.isdigit() else -1


def pick_resume(
    checkpoint_dir: Path, resume: str, problems: Callable[[Path], list[str]], prefix: str = CHECKPOINT_PREFIX
) -> str | None:
    """``resume=auto``: the newest complete checkpoint (or ``None``); ``never``: ``None``; a path: that
    checkpoint, refused with its problems when incomplete."""
    if resume == "never":
        return None
    if resume != "auto":
        path = Path(resume)
        if not path.is_dir():
            raise SystemExit(f"resume={resume!r}: no such checkpoint directory")
        wrong = problems(path)
        if wrong:
            raise SystemExit(f"resume={resume!r} is an incomplete checkpoint: {'; '.join(wrong)}")
        log.info("resuming from %s (resume=%s)", path, resume)
        return str(path)
    found = newest_complete_checkpoint(checkpoint_dir, problems, prefix)
    return str(found) if found else None


def newest_complete_checkpoint(
    checkpoint_dir: Path,
    problems: Callable[[Path], list[str]] | None = None,
    prefix: str = CHECKPOINT_PREFIX,
    move_aside: bool = True,
) -> Path | None:
    """The newest ``<prefix><step>`` directory with no problems. Newer incomplete ones are logged with their
    problems and (on the main process, ``move_aside``) renamed to ``incomplete-<name>``, so the trainer's own
    checkpoint rotation and later resumes never see them."""
    problems = problems or hf_checkpoint_problems
    if not checkpoint_dir.is_dir():
        return None
    candidates = [p for p in checkpoint_dir.glob(f"{prefix}*") if p.is_dir() and step_of(p) >= 0]
    for ckpt in sorted(candidates, key=step_of, reverse=True):
        wrong = problems(ckpt)
        if not wrong:
            log.info("resuming from %s, the newest complete checkpoint", ckpt)
            return ckpt
        log.warning("skipping incomplete checkpoint %s (a kill while saving?): %s", ckpt, "; ".join(wrong))
        if move_aside and is_main_process():
            dest = free_name(checkpoint_dir, f"incomplete-{ckpt.name}")
            ckpt.rename(dest)
            log.warning("moved it to %s", dest)
    return None


def is_main_process() -> bool:
    """Rank 0 of a ``torchrun``/``accelerate`` launch (or a single process): the one that moves directories."""
    return os.environ.get("RANK", "0") == "0"


def hf_checkpoint_problems(ckpt: Path, require_optimizer: bool = True) -> list[str]:
    """Why a Hugging Face ``Trainer`` checkpoint directory cannot be resumed from (empty: it can)."""
    out: list[str] = []
    state = read_json(ckpt / "trainer_state.json")
    if state is None:
        out.append("trainer_state.json (written last) is missing or torn")
    elif step_of(ckpt) >= 0 and state.get("global_step") != step_of(ckpt):
        out.append(f"trainer_state.json is at step {state.get('global_step')}, not {step_of(ckpt)}")
    deepspeed = ckpt / f"global_step{step_of(ckpt)}"
    if deepspeed.is_dir():  # the engine's own shards (model and optimizer states per rank) replace optimizer.pt
        shards = sorted(deepspeed.glob("*.pt"))
        bad = [f.name for f in shards if not torch_archive_whole(f)]
        if not shards or bad:
            out.append(f"{deepspeed.name}/ states missing or truncated: {', '.join(bad) or 'none written'}")
        if not any(f.name.endswith("model_states.pt") for f in shards):
            out += weights_problems(ckpt)
        return out
    out += weights_problems(ckpt)
    if require_optimizer:
        for name in ("optimizer.pt", "scheduler.pt"):
            if not torch_archive_whole(ckpt / name):
                out.append(f"{name} is missing or truncated")
    return out


def weights_problems(ckpt: Path) -> list[str]:
    for index in INDEX_FILES:
        if (ckpt / index).exists():
            data = read_json(ckpt / index)
            if data is None:
                return [f"{index} is torn"]
            shards = sorted(set(data.get("weight_map", {}).values()))
            bad = [s for s in shards if not weights_file_whole(ckpt / s)]
            return [f"weight shards missing or truncated: {', '.join(bad)}"] if bad else []
    present = [ckpt / n for n in WEIGHT_FILES if (ckpt / n).exists()]
    if not present:
        return [f"no model weights ({' / '.join(WEIGHT_FILES)})"]
    bad = [p.name for p in present if not weights_file_whole(p)]
    return [f"truncated weights: {', '.join(bad)}"] if bad else []


def checkpoint_digest(ckpt: Path) -> str:
    """sha256 (16 hex digits) of what loading checkpoint directory ``ckpt`` reads: ``config.json`` and the weights (an
    index and its shards), by name and content. Other files (a fit record, a README) do not count, so a checkpoint
    written again with other weights at the same path has another digest and a copy of it elsewhere the same one."""
    names = {"config.json", *WEIGHT_FILES, *INDEX_FILES}
    for index in INDEX_FILES:
        if isinstance(data := read_json(ckpt / index), dict) and isinstance(data.get("weight_map"), dict):
            names |= {str(s) for s in data["weight_map"].values()}
    h = hashlib.sha256()
    for name in sorted(names):
        if (ckpt / name).is_file():
            h.update(f"{name}\0".encode())
            with (ckpt / name).open("rb") as f:
                while chunk := f.read(1 << 24):
                    h.update(chunk)
    return h.hexdigest()[:16]


def weights_file_whole(path: Path) -> bool:
    if path.suffix == ".safetensors":
        return safetensors_whole(path)
    return torch_archive_whole(path)


def safetensors_whole(path: Path) -> bool:
    """A safetensors file is whole when its JSON header parses and the file is exactly as long as the header
    says (8-byte length, header, then the tensors' byte ranges)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n <= 0 or 8 + n > size:
                return False
            header = json.loads(f.read(n))
    except (OSError, ValueError, struct.error):
        return False
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    return size == 8 + n + max(ends, default=0)


def torch_archive_whole(path: Path) -> bool:
    """``torch.save`` writes a zip archive; a cut one has no end-of-central-directory record."""
    try:
        return path.is_file() and zipfile.is_zipfile(path)
    except OSError:
        return False


def write_summary(run: RunPlan | Path, summary: dict[str, Any], title: str) -> str:
    """Write ``summary.json`` atomically (through the run's plan, which also records that the run finished,
    when given one) and print and return a readable block."""
    if isinstance(run, RunPlan):
        run.finish(summary)
    else:
        write_json(Path(run) / SUMMARY_FILE, summary)
    text = format_block(summary, title)
    print(text, flush=True)
    return text


def finish_run(plan: RunPlan | Path, logger: Any, summary: dict[str, Any], title: str) -> dict[str, Any]:
    """Write and print the summary (recording through the run plan that the run finished), log its numbers."""
    write_summary(plan, summary, title)
    logger.summary({k: v for k, v in summary.items() if isinstance(v, int | float)})
    logger.finish()
    return summary
