"""One experiment-tracking helper for every entry point (W&B, or a null logger).

Mode ``auto``: online when ``WANDB_API_KEY`` is set, offline otherwise; the ``WANDB_MODE``
environment variable, when set, wins over auto/online/offline (tests set it to ``disabled``), but never
over ``disabled`` (``logger=none``): a user who turned logging off gets no run. The API key is never
printed or logged: config values whose key names a secret are replaced by ``***`` (:func:`is_secret_name`).

Key scheme (every run, :func:`run_identity`):
- **group** = the experiment: ``logger.group`` when set, else ``<model>/<benchmark|data|task|pipeline>``,
  so all arms of one comparison (e.g. every method on one model and benchmark) share a group (KVzap: the pairs
  pipeline and the fit on its pairs, ``<model>/kvzap_pairs``, not the unused ``data=traces`` default);
- **job type** = ``train`` | ``eval`` | ``bench`` | ``analysis`` | ``data_prep`` | ``allocate``;
- **run name** = method × model × benchmark (or data / task): ``<run_name>-<model>-<benchmark>``, parts
  already in ``run_name`` not repeated;
- **summary keys** are namespaced by the job type: ``eval/accuracy``, ``eval/kv_per_512``,
  ``train/loss_end``, ``bench/tokens_per_s/<policy>/b8`` (:meth:`RunLogger.summary`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import logging
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
# A name is secret when one of its words (split at _ - . and camelCase) is one of these ...
_SECRET_WORDS = frozenset({"password", "passwd", "passphrase", "secret", "apikey", "credential", "credentials"})
# ... or its last word is "key" (api_key, access_key; not num_key_value_heads, api_key_env), or it is
# "token" after one of these qualifiers (api_token, hf_token; not max_new_tokens, pad_token, trace_tokens).
_TOKEN_QUALIFIERS = frozenset(
    {"api", "hf", "hub", "auth", "access", "refresh", "bearer", "wandb", "github", "gh", "openai", "session",
     "private", "secret", "slack", "personal"}
)  # fmt: skip


def is_secret_name(name: str) -> bool:
    """Whether a config key names a secret (see the word lists above); ``token`` alone counts too."""
    words = [w for w in re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", str(name)).lower()) if w]
    if not words:
        return False
    if _SECRET_WORDS.intersection(words) or words[-1] == "key":
        return True
    if words[-1] == "token":
        return len(words) == 1 or words[-2] in _TOKEN_QUALIFIERS
    return False


WANDB_MODES = ("online", "offline", "disabled", "dryrun", "run", "shared")  # what wandb.init's settings accept


def resolve_mode(mode: str) -> str:
    """``disabled`` always wins; otherwise ``WANDB_MODE`` when set, else the configured mode. An unknown mode, in the
    config or the environment, is a :class:`SettingsError` (entry points check it before any run state: a bad
    ``WANDB_MODE`` was pydantic's traceback from ``wandb.init`` after the config and fingerprint were written)."""
    from zoomr.schemas.checks import SettingsError

    if mode not in ("auto", "online", "offline", "disabled"):
        raise SettingsError(f"logger.mode must be auto|online|offline|disabled, got {mode!r}")
    if mode == "disabled":
        return "disabled"
    env = os.environ.get("WANDB_MODE")
    if env is not None:  # set but empty (WANDB_MODE=) is refused too: wandb.init reads it and fails
        if env not in WANDB_MODES:
            raise SettingsError(f"the environment's WANDB_MODE={env!r} is not a W&B mode: set online, offline or "
                                "disabled, or unset it (logger=none turns W&B off)")  # fmt: skip
        return env
    if mode == "auto":
        return "online" if os.environ.get("WANDB_API_KEY") else "offline"
    return mode


HF_WANDB_MODULE = "transformers.integrations.integration_utils"  # the HF Trainer's W&B callback (``report_to``)
HF_OFFLINE_NOTICE = "[INFO] Running in WANDB offline mode"


def import_hf_wandb_quietly() -> None:
    """Import transformers' W&B integration (which the HF Trainer imports) without the line it prints on stdout
    when imported under ``WANDB_MODE=offline``, ``[INFO] Running in WANDB offline mode``: the trainers log to the
    project's own W&B run (:func:`init_run`, which says its mode), so the line only repeated what the user set.
    Anything else printed meanwhile is printed as before; without ``WANDB_MODE=offline`` this imports nothing."""
    if os.environ.get("WANDB_MODE") != "offline" or HF_WANDB_MODULE in sys.modules:
        return
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        importlib.import_module(HF_WANDB_MODULE)
    if rest := "".join(line for line in said.getvalue().splitlines(True) if line.strip() != HF_OFFLINE_NOTICE):
        sys.stdout.write(rest)


def scrub_secrets(obj: Any) -> Any:
    """Replace non-empty values whose key names a secret (:func:`is_secret_name`) with '***', recursively."""
    if isinstance(obj, dict):
        return {k: "***" if v and is_secret_name(k) else scrub_secrets(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [scrub_secrets(v) for v in obj]
    return obj


@dataclass(frozen=True)
class RunIdentity:
    """Where a run lands in W&B (module docstring: the key scheme)."""

    name: str
    group: str
    job_type: str


def run_identity(config: dict[str, Any], job_type: str, target: str | None = None) -> RunIdentity:
    """Name and group of a run from its resolved config (plain dict of any entry point). ``target``: what the run
    works on, where that is not the config's benchmark, data, task or pipeline (KVzap's pairs: the data group is
    only the entry's unused ``data=traces`` default there)."""
    method = (config.get("method") or {}).get("name") or ("full" if job_type == "eval" else "none")
    run_name = str(config.get("run_name") or method)
    model = (config.get("model") or {}).get("name")
    target = target or next(
        (
            (config.get(group) or {}).get("name")
            for group in ("benchmark", "data", "task", "pipeline")
            if (config.get(group) or {}).get("name")
        ),
        None,
    )
    parts = [run_name] + [p for p in (model, target) if p and p not in run_name]
    group = (config.get("logger") or {}).get("group") or "/".join(p for p in (model, target) if p) or job_type
    return RunIdentity(name="-".join(parts), group=group, job_type=job_type)


class RunLogger:
    """Thin wrapper over a wandb run; every method is a no-op when disabled. ``namespace`` (the job type)
    prefixes summary keys: ``summary({"accuracy": 0.5})`` sets ``eval/accuracy``. ``config``: the run's config as
    :func:`init_run` gave it, put back over what others wrote into it when the run finishes (:meth:`finish`)."""

    def __init__(self, run: Any = None, namespace: str | None = None, config: dict[str, Any] | None = None):
        self.run = run
        self.namespace = namespace
        self.config = config

    @property
    def enabled(self) -> bool:
        return self.run is not None

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        if self.run is not None:
            self.run.log(metrics, step=step)

    def summary(self, metrics: dict[str, Any]) -> None:
        if self.run is not None:
            prefix = f"{self.namespace}/" if self.namespace else ""
            self.run.summary.update({f"{prefix}{k}": v for k, v in metrics.items()})

    def table(self, key: str, columns: list[str], rows: list[list[Any]]) -> None:
        if self.run is not None:
            import wandb

            self.run.log({key: wandb.Table(columns=columns, data=rows)})

    def image(self, key: str, path: str | Path) -> None:
        if self.run is not None:
            import wandb

            self.run.log({key: wandb.Image(str(path))})

    def finish(self) -> None:
        if self.run is not None:
            if self.config:  # the HF Trainer's W&B callback (report_to=wandb) writes its TrainingArguments into this
                # run's config at the start of training, over the project's keys of the same name: run_name became
                # None (or the checkpoint directory) and deepspeed lost its choice's name
                self.run.config.update(self.config, allow_val_change=True)
            self.run.finish()
            self.run = None


def init_run(
    *,
    project: str,
    name: str,
    group: str | None,
    config: dict[str, Any],
    mode: str = "auto",
    entity: str | None = None,
    tags: list[str] | None = None,
    dir: str | Path | None = None,
    job_type: str | None = None,
    same_run: bool = False,
    run_key: str | None = None,
) -> RunLogger:
    """Start a W&B run (or return a disabled logger). ``config`` is the resolved config, scrubbed. ``same_run``:
    every run in ``dir`` (of one ``run_key``, when given) is one W&B run (:func:`kept_run_id`), resumed by a rerun
    rather than added again."""
    mode = resolve_mode(mode)
    if mode == "disabled":
        return RunLogger(None)
    import wandb

    run_id = kept_run_id(dir, run_key) if same_run and dir else None
    config = scrub_secrets(config)
    try:
        run = wandb.init(
            id=run_id,
            resume="allow" if run_id else None,
            project=project,
            entity=entity,
            name=name,
            group=group,
            tags=tags or None,
            job_type=job_type,
            config=config,
            mode=mode,
            dir=str(dir) if dir else None,
            reinit="finish_previous",
        )
    except (wandb.errors.UsageError, wandb.errors.AuthenticationError, wandb.errors.CommError) as e:
        from zoomr.schemas.checks import SettingsError

        # online without a key (or with a refused one, or no way to the server) was wandb's traceback
        raise SettingsError(
            f"W&B could not start the run in {mode} mode ({str(e).strip()}): give W&B a key (`wandb login` or "
            "WANDB_API_KEY), or log offline with WANDB_MODE=offline (`wandb sync` later), or turn W&B off (logger=none)"
        ) from None
    log.info("W&B run %s (%s, group %s, job type %s)", name, mode, group, job_type)
    return RunLogger(run, namespace=job_type, config=config)


RUN_ID_FILE = "zoomr_run_id"  # under <dir>/wandb/, beside W&B's own files


def kept_run_id(dir: str | Path, key: str | None = None) -> str:
    """The W&B run id of the runs in ``dir``, made by the first and kept in ``<dir>/wandb/zoomr_run_id``: a rerun of
    the same evaluation (resumed after a kill, or the finished command again) updates that W&B run; it added another
    run each time, the finished one's figures twice in the project (offline: each rerun's files sync into the one run).
    ``key``: one id per key within ``dir`` (``zoomr_run_id-<hash of key>``), for runs that share a directory but not
    their work (a data-prep pipeline's output directory: ``summarize`` on two data sets writes one run directory).
    Removing ``<dir>/wandb/`` starts a new W&B run."""
    name = RUN_ID_FILE if key is None else f"{RUN_ID_FILE}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
    path = Path(dir) / "wandb" / name
    if path.is_file() and re.fullmatch(r"[0-9a-z]{8,64}", kept := path.read_text().strip()):
        return kept
    import uuid

    path.parent.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:16]
    path.write_text(run_id + "\n")
    return run_id


def log_summary_run(
    *,
    job_type: str,
    name: str,
    group: str,
    config: dict[str, Any],
    metrics: dict[str, Any],
    mode: str = "auto",
    dir: str | Path | None = None,
    project: str = "zoomr",
    run_key: str | None = None,
) -> dict[str, Any]:
    """One short run holding only summary metrics (benches): ``<job_type>/<metric>`` keys, the key scheme above.
    ``run_key``: what the metrics are of; logging them again resumes that W&B run (:func:`kept_run_id` in ``dir``).
    Returns the run's summary as W&B holds it (empty when disabled)."""
    logger = init_run(project=project, name=name, group=group, config=config, mode=mode, dir=dir, job_type=job_type,
                      same_run=run_key is not None, run_key=run_key)  # fmt: skip
    logger.summary({k: v for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)})
    held = dict(logger.run.summary) if logger.enabled else {}
    logger.finish()
    return held
