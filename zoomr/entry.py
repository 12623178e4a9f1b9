"""Glue shared by the ``python -m <entry point>`` modules: schema registration, plain-object conversion.

Only entry points import this; the rest of the library takes plain arguments.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from hydra.experimental.callback import Callback

from zoomr.models import ModelSpec, spec_from_dict
from zoomr.paths import output_problem
from zoomr.rundir import is_main_process, write_json
from zoomr.schemas import register_with_hydra
from zoomr.schemas.checks import SettingsError
from zoomr.script import USER_ERRORS, interrupted, user_error_message
from zoomr.startup import started, stop_on_sigterm
from zoomr.tracking import RunLogger, init_run, resolve_mode, run_identity

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


def hydra_entry(
    config_name: str, resumes_from: Callable[[Any], Any] | None = None, settings: Callable[[Any], Any] | None = None
) -> Callable:
    """``@hydra_entry("train")`` = ``@hydra.main`` on conf/<config_name>.yaml with our schemas registered.

    ``resumes_from(cfg)``: the directory a rerun of the same command continues from after Ctrl-C or SIGTERM (eval's appended
    rows, train's checkpoints, the miniature's arms), None where it starts over; the interrupted line names it.
    ``settings(cfg)``: the entry point's own checks of a config that need no model or data (its run calls them too);
    a ``--multirun`` runs them for every job before any starts (:func:`check_sweep`)."""
    import hydra

    register_with_hydra()
    if settings is not None:
        SETTINGS_CHECKS[config_name] = settings

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def task(cfg: Any) -> Any:
            started()  # from here on Ctrl-C is a KeyboardInterrupt, reported below with where a rerun resumes
            try:
                with stop_on_sigterm():  # SIGTERM (kill, SLURM's time limit) too, with status 143
                    check_run_settings(cfg)
                    return fn(cfg)
            except USER_ERRORS as e:  # what the user gave is wrong: the message alone
                stop = SystemExit(user_error_message(e))
            except KeyboardInterrupt as e:
                stop = interrupted(config_name, resumes_from(cfg) if resumes_from else None, e)
            except SystemExit as e:  # a refusal
                stop = e
            except Exception:  # a bug: its traceback, but the .hydra/ of the run already there is kept as on a refusal
                KeepRunRecord.restore()
                raise
            KeepRunRecord.restore()  # .hydra/ of the run already in the directory, when this one wrote nothing there
            discard_empty_run_dir()  # a refused run leaves no directory holding only Hydra's log behind
            raise stop from None

        return hydra.main(config_path=CONF_DIR, config_name=config_name, version_base="1.3")(task)

    return wrap


def check_run_settings(cfg: Any, here: bool = True) -> None:
    """The checks every entry point runs before its own code, before a model loads or a file is written: ``seed``,
    the output directories, ``device``, ``cache_dir``, ``logger.mode`` and ``WANDB_MODE``. ``here=False`` (a sweep's
    job, checked before it is submitted to a machine that may be another): the device's name only, no cache dir."""
    check_seed(cfg.get("seed"))
    for key in OUTPUT_DIRS:
        check_run_dir(select(cfg, key), key)
    check_device(cfg.get("device"), present=here)
    if here:
        check_cache_dir(cfg.get("cache_dir"))
    if (mode := select(cfg, "logger.mode")) is not None:
        resolve_mode(mode)


class LauncherCheck(Callback):
    """A Hydra callback (``hydra.callbacks.launcher_check`` in every entry config) that checks a ``--multirun``
    before any job is made (:func:`check_sweep`), and refuses in one line a SLURM launcher (``hydra/launcher=slurm_h100``
    or ``submitit_slurm``) on a machine without ``srun`` (it was submitit's ``Could not detect "srun"`` under Hydra's
    traceback) or ``sbatch`` (a ``FileNotFoundError`` traceback), or a launcher setting that does not resolve."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        from omegaconf import OmegaConf
        from omegaconf.errors import ValidationError

        try:  # an environment variable the launcher reads (ZOOMR_SLURM_TIME_MIN=abc): one line naming the key, not
            OmegaConf.to_container(config.hydra.launcher, resolve=True)  # omegaconf's traceback from Hydra's setup
        except ValidationError as e:
            raise SystemExit(f"{e.full_key}: {str(e).splitlines()[0]}") from None
        target = str(select(config, "hydra.launcher._target_") or "")
        missing = [c for c in ("srun", "sbatch") if shutil.which(c) is None]  # submitit needs srun, then sbatch
        if target.endswith("SlurmLauncher") and missing:
            choice = config.hydra.runtime.choices.get("hydra/launcher", "submitit_slurm")
            raise SystemExit(
                f"hydra/launcher={choice} submits the jobs to SLURM, but this machine has no `{'` or `'.join(missing)}`: "
                "run it on a SLURM login node, or sweep here with hydra/launcher=basic (one job after another) or "
                "submitit_local"
            )
        check_sweep(config, kwargs.get("config_name"))


SETTINGS_CHECKS: dict[str, Callable[[Any], Any]] = {}  # entry config name -> its settings check (hydra_entry)


def check_sweep(config: Any, config_name: str | None = None) -> None:
    """Every job of a ``--multirun`` (Hydra's basic sweeper: the product of the swept values) composed and put through
    :func:`check_run_settings` and the entry point's own settings check (``hydra_entry(settings=…)``) before the sweep
    directory or any job is made, and refused when two jobs would write
    one output directory. A bad value (``seed=1,-1``) was refused by its own job only, after the jobs before it had
    run, or, through submitit, after every job had been submitted (on SLURM: queued), ending in submitit's
    ``UncompletedJobError`` traceback; two eval jobs differing in a setting outside ``run_name`` shared one run
    directory, the second refused there (or blocked by the first's lock) after its model had loaded."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf, open_dict, read_write

    if not str(select(config, "hydra.sweeper._target_") or "").endswith("BasicSweeper"):
        return  # another sweeper picks its jobs as it goes
    if not GlobalHydra.instance().is_initialized():
        return  # not inside a Hydra app (a config composed by hand): no loader to compose the jobs with
    loader = GlobalHydra.instance().config_loader()
    params = [f"{k}={v}" for k, v in (select(config, "hydra.sweeper.params") or {}).items()]
    overrides = OverridesParser.create(config_loader=loader).parse_overrides(
        params + list(OmegaConf.to_container(config.hydra.overrides.task, resolve=False))
    )
    swept = {o.get_key_element() for o in overrides if o.is_sweep_override()}
    jobs = BasicSweeper.split_arguments(overrides, None)[0]
    held, writers = HydraConfig.instance(), {}
    master = held.cfg  # None here: Hydra sets it for each job
    try:
        for num, job in enumerate(jobs):
            cfg = loader.load_sweep_config(config, list(job))
            with open_dict(cfg):  # as Hydra's launchers and run_job set them (train's run_dir is the job's directory)
                cfg.hydra.job.id, cfg.hydra.job.num = f"{cfg.hydra.job.name}_{num}", num
            held.set_config(cfg)
            with read_write(cfg.hydra.runtime):
                cfg.hydra.runtime.output_dir = os.path.abspath(Path(str(cfg.hydra.sweep.dir), str(cfg.hydra.sweep.subdir)))
            held.set_config(cfg)
            name = " ".join(o for o in job if o.split("=", 1)[0] in swept) or " ".join(job)
            try:
                check_run_settings(cfg, here=False)
                if (settings := SETTINGS_CHECKS.get(str(config_name))) is not None:
                    settings(cfg)
            except USER_ERRORS as e:
                raise SystemExit(f"--multirun job #{num} ({name}): {user_error_message(e)}; no job was started") from None
            except SystemExit as e:
                raise SystemExit(f"--multirun job #{num} ({name}): {e.code}; no job was started") from None
            for key in OUTPUT_DIRS:
                if isinstance(out := select(cfg, key), str):
                    where = (key, os.path.abspath(os.path.expanduser(out)))
                    if where in writers:
                        first, other = writers[where]
                        raise SystemExit(
                            f"--multirun jobs #{first} ({other}) and #{num} ({name}) would both write {key}={out}: "
                            f"give each job its own {'run_name' if key == 'run_dir' else key} (e.g. "
                            "'run_name=${method.name}-<the swept value>'); no job was started"
                        )
                    writers[where] = (num, name)
    finally:
        held.cfg = master


class KeepRunRecord(Callback):
    """A Hydra callback (``hydra.callbacks.keep_run_record`` in every entry config): Hydra writes ``.hydra/`` (the
    config and overrides) into the run directory before any of our checks, so a refused rerun into a finished run's
    directory left ``.hydra/`` describing the refused command. ``on_run_start`` keeps the ``.hydra/`` files already
    there and the state of the directory's other entries; :meth:`restore` (on every refusal, error or Ctrl-C) puts
    them back when the refused run changed none of those entries."""

    _kept: tuple[Path, dict[str, bytes], dict[str, tuple[int, int]]] | None = None

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        KeepRunRecord._kept = None
        subdir = select(config, "hydra.output_subdir")
        try:
            out = Path(str(select(config, "hydra.run.dir")))
        except Exception:  # noqa: BLE001 - a directory Hydra cannot resolve yet: nothing to keep
            return
        record = out / str(subdir)
        if subdir is None or not record.is_dir():
            return
        files = {p.name: p.read_bytes() for p in record.iterdir() if p.is_file()}
        KeepRunRecord._kept = (record, files, _entries(out, config.hydra.job.name))

    @staticmethod
    def restore() -> None:
        """Put back the ``.hydra/`` files of the run directory's earlier run if this run wrote nothing else there."""
        from hydra.core.hydra_config import HydraConfig

        kept, KeepRunRecord._kept = KeepRunRecord._kept, None
        if kept is None or not HydraConfig.initialized():
            return
        record, files, entries = kept
        if _entries(record.parent, HydraConfig.get().job.name) != entries:
            return  # this run wrote into the directory: its .hydra/ describes what is there now
        for p in record.iterdir():
            if p.is_file() and p.name not in files:
                p.unlink()
        for name, data in files.items():
            (record / name).write_bytes(data)


def _entries(run_dir: Path, job_name: str) -> dict[str, tuple[int, int]]:
    """(mtime_ns, size) of everything under ``run_dir``, at any depth, but ``.hydra``, Hydra's job log and the run
    lock (taking it rewrites the holder's pid: a rerun refused after it, e.g. for other settings, wrote nothing).
    Only the top-level entries were compared, the lock among them, so such a refusal kept the refused command's
    ``.hydra/``, and a run that wrote only below a subdirectory's top level counted as having written nothing."""
    from zoomr.runlock import LOCK_FILE

    if not run_dir.is_dir():
        return {}
    own = {".hydra", f"{job_name}.log", LOCK_FILE}
    out: dict[str, tuple[int, int]] = {}
    for top, dirs, files in os.walk(run_dir):
        here = Path(top)
        if here == run_dir:
            dirs[:] = [d for d in dirs if d not in own]
            files = [f for f in files if f not in own]
        for name in (*dirs, *files):
            try:
                st = (here / name).stat()
            except OSError:  # removed meanwhile (a temporary file)
                continue
            out[str((here / name).relative_to(run_dir))] = (st.st_mtime_ns, st.st_size)
    return out


SEED_RANGE = (0, 2**32 - 1)  # numpy's (and transformers.set_seed's) range; torch alone would take more


def check_seed(seed: Any) -> None:
    """Refuse a ``seed=`` numpy cannot take before any run state is written (a trainer failed on it only after
    writing its settings and config)."""
    if isinstance(seed, int) and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise SystemExit(f"seed={seed}: must be in [{SEED_RANGE[0]}, 2**32 - 1]")


OUTPUT_DIRS = ("run_dir", "task.out", "pipeline.out_dir")  # the directories an entry point's run writes into


def select(cfg: Any, key: str) -> Any:
    """``cfg``'s value at the dotted ``key`` (None where the config has no such key); a DictConfig or plain dicts."""
    if isinstance(cfg, dict):
        for part in key.split("."):
            cfg = cfg.get(part) if isinstance(cfg, dict) else None
        return cfg
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, key, default=None)


def check_run_dir(run_dir: Any, key: str = "run_dir") -> None:
    """Refuse an output directory setting (``run_dir=``, ``task.out=``, ``pipeline.out_dir=``) that names an existing
    file before a model loads (it failed at the first write with a ``FileExistsError`` traceback, after the model and
    data were loaded, or after paper_tables had read every run)."""
    if isinstance(run_dir, str) and (problem := output_problem(run_dir, directory=True)):
        raise SystemExit(f"{key}={problem}")


def check_device(name: Any, present: bool = True) -> None:
    """Refuse a ``device=`` other than auto | cpu | cuda | cuda:N, or (``present``) a CUDA device this machine lacks,
    before a model loads (torch's own errors came after it: "Torch not compiled with CUDA enabled", or a list of 20
    device types for ``device=tpu``)."""
    if (problem := device_problem(name, present)) is not None:
        raise SystemExit(f"device={name}: {problem}" + ("; use device=auto or device=cpu" if problem.startswith("this machine") else ""))


def device_problem(name: Any, present: bool = True, auto: bool = True) -> str | None:
    """What is wrong with the device ``name`` (None: nothing): not (``auto``) auto, cpu, cuda or cuda:N, or
    (``present``) a CUDA device this machine lacks (the analysis scripts' ``--device`` takes no auto)."""
    if name is None or name == "cpu" or (auto and name == "auto"):
        return None
    kind, _, index = str(name).partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        return f"give {'auto (CUDA when present, else CPU), ' if auto else ''}cpu, cuda or cuda:N"
    if not present:
        return None
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if int(index or 0) >= count:
        return f"this machine has {count} CUDA device(s)"
    return None


def check_cache_dir(cache_dir: Any) -> None:
    """Make sure ``cache_dir=`` (where tiny models, tokenizers and decrypted data are built) is a writable
    directory before a model loads: an unusable one failed deep inside ``tokenizer.save_pretrained`` with a
    ``FileNotFoundError`` traceback. Creating the (empty) cache directory is the only thing this writes."""
    if not isinstance(cache_dir, str):
        return
    path = Path(cache_dir)
    if path.exists() and not path.is_dir():
        raise SystemExit(f"cache_dir={cache_dir} is a file: the cache is a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SystemExit(f"cache_dir={cache_dir} cannot be created ({e.strerror}); give a writable directory") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise SystemExit(f"cache_dir={cache_dir} is not writable; give a writable directory")


def to_plain(cfg: Any) -> dict[str, Any]:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def require_group(cfg: Any, group: str, entry: str) -> None:
    """Fail with the available options when a group without default was not chosen (``+group=name``).

    ``python -m train`` lists only the methods that train (decoding policies are ``python -m eval``'s); the run
    directory Hydra made for the aborted run is removed by :func:`hydra_entry` as for every refusal.
    """
    if cfg.get(group) is None:
        from zoomr.configs import available, trainable_methods

        options = trainable_methods() if (entry, group) == ("train", "method") else available(group)
        extra = "; decoding policies (h2o, snapkv, …) run with `python -m eval +method=<name>`" if entry == "train" else ""
        raise SystemExit(
            f"no {group} chosen: run `python -m {entry} +{group}=<name>`; available {group}s: {', '.join(options)}"
            + extra
        )


def discard_empty_run_dir() -> None:
    """Remove the directory Hydra created for this run if it holds nothing but Hydra's own files."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    hydra = HydraConfig.get()
    out = Path(hydra.runtime.output_dir)
    own = {".hydra", f"{hydra.job.name}.log"}
    if out.is_dir() and all(p.name in own for p in out.iterdir()):
        shutil.rmtree(out, ignore_errors=True)


def model_spec(cfg: Any) -> ModelSpec:
    return spec_from_dict(to_plain(cfg.model))


def pick_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def start_run(
    cfg: Any, job_type: str, same_run: bool = False, run_key: str | None = None, target: str | None = None
) -> tuple[Path, RunLogger]:
    """Create the run directory, write the resolved config, start the tracker (``same_run``: one W&B run per run
    directory, or per ``run_key`` in it, resumed by a rerun; :func:`zoomr.tracking.kept_run_id`; ``target``: what the
    run works on where the config's groups do not say it, :func:`zoomr.tracking.run_identity`). Only rank 0 of a
    ``torchrun``/``accelerate`` launch tracks: every rank started a W&B run of its own (eight runs of one name for
    a training on eight GPUs, seven holding only the config and the end-of-run summary)."""
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    plain = to_plain(cfg)
    write_json(run_dir / "config.json", plain)
    ident = run_identity(plain, job_type, target)
    logger = init_run(
        project=cfg.logger.project,
        entity=cfg.logger.entity,
        name=ident.name,
        group=ident.group,
        tags=list(cfg.logger.tags),
        config=plain,
        mode=cfg.logger.mode if is_main_process() else "disabled",
        dir=run_dir,
        job_type=job_type,
        same_run=same_run,
        run_key=run_key,
    )
    return run_dir, logger


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def setup_logging() -> None:
    """Log at INFO, or at the environment's ``ZOOMR_LOG_LEVEL``. Under Hydra, which configures logging first, the
    variable was ignored (``basicConfig`` does nothing once handlers exist), and an unknown level passed unseen."""
    name = os.environ.get("ZOOMR_LOG_LEVEL", "INFO").upper()
    if name not in LOG_LEVELS:
        raise SettingsError(f"ZOOMR_LOG_LEVEL={os.environ['ZOOMR_LOG_LEVEL']!r}: give one of {', '.join(LOG_LEVELS)}")
    logging.basicConfig(level=name, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger().setLevel(name)
