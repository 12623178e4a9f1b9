"""The W&B helper: mode resolution, secrets never uploaded, a disabled logger is a no-op."""

from __future__ import annotations

import pytest

from zoomr.tracking import RunLogger, init_run, is_secret_name, resolve_mode, run_identity, scrub_secrets


def test_mode_resolution(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert resolve_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert resolve_mode("auto") == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_mode("online") == "disabled"
    monkeypatch.delenv("WANDB_MODE")
    with pytest.raises(ValueError, match="logger.mode"):
        resolve_mode("sometimes")


def test_an_unknown_mode_is_refused_before_the_run_writes_anything(tmp_path, monkeypatch):
    """``WANDB_MODE=bogus`` was pydantic's traceback from ``wandb.init``, and ``logger.mode=bogus`` a ValueError
    traceback, both after the model loaded and ``config.json`` and ``fingerprint.json`` were written."""
    import os
    import subprocess
    import sys

    from zoomr.paths import REPO_ROOT
    from zoomr.schemas.checks import SettingsError

    monkeypatch.setenv("WANDB_MODE", "bogus")
    with pytest.raises(SettingsError, match="the environment's WANDB_MODE='bogus' is not a W&B mode"):
        resolve_mode("auto")
    assert resolve_mode("disabled") == "disabled"  # logger=none never reads it
    monkeypatch.setenv("WANDB_MODE", "")  # `export WANDB_MODE=`: resolved as unset here, pydantic's traceback in wandb
    with pytest.raises(SettingsError, match="the environment's WANDB_MODE='' is not a W&B mode"):
        resolve_mode("auto")
    monkeypatch.setenv("WANDB_MODE", "bogus")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    for extra, message in (([], "WANDB_MODE='bogus' is not a W&B mode"),
                           (["logger.mode=bogus"], "logger.mode must be auto|online|offline|disabled, got 'bogus'")):  # fmt: skip
        run_dir = tmp_path / "run"
        proc = subprocess.run([sys.executable, "-m", "eval", "benchmark.problem_limit=1", "generation.n_samples=1",
                               f"run_dir={run_dir}", *extra], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
        assert proc.returncode == 1 and "Traceback" not in proc.stderr and message in proc.stderr, proc.stderr[-1500:]
        assert not run_dir.exists()
        env["WANDB_MODE"] = "offline"


def test_secrets_are_scrubbed():
    cfg = {"summarizer": {"api_key": "sk-123", "base_url": "http://x"}, "list": [{"hf_token": "t"}], "lr": 1}
    out = scrub_secrets(cfg)
    assert out == {"summarizer": {"api_key": "***", "base_url": "http://x"}, "list": [{"hf_token": "***"}], "lr": 1}


def test_disabled_logger_is_a_noop():
    logger = init_run(project="p", name="n", group=None, config={}, mode="disabled")
    assert isinstance(logger, RunLogger) and not logger.enabled
    logger.log({"a": 1})
    logger.summary({"b": 2})
    logger.finish()


def test_offline_run_writes_locally_without_the_key(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "secret-key-should-not-leak-0123456789abcd")
    logger = init_run(project="p", name="n", group="g", config={"api_key": "secret-key"}, mode="offline", dir=tmp_path)
    assert logger.enabled
    logger.log({"loss": 1.0}, step=1)
    logger.finish()
    files = list((tmp_path / "wandb").rglob("*"))
    assert any(f.name.endswith(".wandb") for f in files)
    for f in files:
        if f.is_file() and f.suffix in (".yaml", ".json", ".log", ".txt"):
            assert "secret-key" not in f.read_text(errors="ignore")


def test_secret_names_are_real_secret_patterns_not_token_counts():
    for name in ("api_key", "apiKey", "WANDB_API_KEY", "hf_token", "api_token", "token", "password", "client_secret"):
        assert is_secret_name(name), name
    for name in ("max_new_tokens", "trace_tokens", "num_key_value_heads", "pad_token", "api_key_env", "n_keys",
                 "save_token_ids", "max_tokens", "tokens_per_doc"):  # fmt: skip
        assert not is_secret_name(name), name


def test_token_count_settings_reach_wandb_unchanged(tmp_path, monkeypatch):
    """Regression: every key containing "token" was scrubbed, so max_new_tokens arrived as '***'."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    config = {"generation": {"max_new_tokens": 31744}, "data": {"trace_tokens": 1024},
              "model": {"num_key_value_heads": 2}, "summarizer": {"hf_token": "hf_SECRETVALUE", "api_key_env": "K"}}  # fmt: skip
    logger = init_run(project="p", name="n", group="g", config=config, mode="offline", dir=tmp_path)
    uploaded = dict(logger.run.config)  # the config of the real (offline) run, as it will sync
    logger.finish()
    assert uploaded["generation"] == {"max_new_tokens": 31744}
    assert uploaded["data"] == {"trace_tokens": 1024}
    assert uploaded["model"] == {"num_key_value_heads": 2}
    assert uploaded["summarizer"] == {"hf_token": "***", "api_key_env": "K"}
    for f in (tmp_path / "wandb").rglob("*"):
        assert not f.is_file() or b"hf_SECRETVALUE" not in f.read_bytes()


def test_logger_none_wins_over_wandb_mode(tmp_path, monkeypatch):
    """Regression: ``logger=none`` (mode disabled) was overridden by WANDB_MODE=offline."""
    from hydra import compose, initialize_config_dir

    from zoomr.entry import CONF_DIR, start_run
    from zoomr.schemas import register_with_hydra

    monkeypatch.setenv("WANDB_MODE", "offline")
    assert resolve_mode("disabled") == "disabled" and resolve_mode("auto") == "offline"
    register_with_hydra()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("eval", overrides=["logger=none", f"run_dir={tmp_path / 'run'}"])
    _, logger = start_run(cfg, job_type="eval")
    assert not logger.enabled
    assert not (tmp_path / "run" / "wandb").exists()


def test_run_identity_key_scheme():
    eval_cfg = {"run_name": "abridge", "method": {"name": "abridge"}, "model": {"name": "r1-7b"},
                "benchmark": {"name": "suite"}, "logger": {"group": None}}  # fmt: skip
    ident = run_identity(eval_cfg, "eval")
    assert (ident.name, ident.group, ident.job_type) == ("abridge-r1-7b-suite", "r1-7b/suite", "eval")
    train_cfg = {"run_name": "abridge-tiny-qwen2-traces", "method": {"name": "abridge"}, "model": {"name": "tiny-qwen2"},
                 "data": {"name": "traces"}, "logger": {"group": "paper-table1"}}  # fmt: skip
    ident = run_identity(train_cfg, "train")
    assert (ident.name, ident.group) == ("abridge-tiny-qwen2-traces", "paper-table1")
    assert run_identity({"model": {"name": "m"}, "benchmark": {"name": "b"}}, "eval").name == "full-m-b"


def test_summary_keys_are_namespaced_by_job_type(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    logger = init_run(project="p", name="n", group="g", config={}, mode="offline", dir=tmp_path, job_type="eval")
    logger.summary({"accuracy": 0.25, "kv_per_512": 64.0})
    data = dict(logger.run.summary)
    logger.finish()
    assert data["eval/accuracy"] == 0.25 and data["eval/kv_per_512"] == 64.0 and "accuracy" not in data


def test_the_log_level_variable_applies_after_hydra_configured_logging_and_a_bad_one_is_named(monkeypatch):
    """``ZOOMR_LOG_LEVEL`` went to ``logging.basicConfig``, which does nothing once Hydra has installed its handlers:
    ``ZOOMR_LOG_LEVEL=DEBUG`` changed nothing, and ``=bogus`` passed unseen."""
    import logging

    from zoomr.entry import setup_logging
    from zoomr.schemas.checks import SettingsError

    root = logging.getLogger()
    handler, level = logging.NullHandler(), root.level
    root.addHandler(handler)  # as Hydra's job logging leaves the root logger
    try:
        for given, expected in (("debug", logging.DEBUG), ("WARNING", logging.WARNING), (None, logging.INFO)):
            if given is None:
                monkeypatch.delenv("ZOOMR_LOG_LEVEL", raising=False)
            else:
                monkeypatch.setenv("ZOOMR_LOG_LEVEL", given)
            setup_logging()
            assert root.level == expected
        monkeypatch.setenv("ZOOMR_LOG_LEVEL", "bogus")
        with pytest.raises(SettingsError, match="ZOOMR_LOG_LEVEL='bogus': give one of DEBUG, INFO, WARNING, ERROR"):
            setup_logging()
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def test_a_run_directory_keeps_one_wandb_run_across_reruns(tmp_path, monkeypatch):
    """Each rerun of an evaluation (resumed after a kill, or the finished command again) started another W&B run of
    the same name, the finished one's figures twice in the project; now ``same_run`` resumes the directory's run."""
    import wandb

    from zoomr.tracking import RUN_ID_FILE, kept_run_id

    monkeypatch.delenv("WANDB_MODE", raising=False)
    asked = []
    monkeypatch.setattr(wandb, "init", lambda **kw: asked.append(kw) or object())
    for _ in range(2):
        init_run(project="p", name="n", group="g", config={}, mode="offline", dir=tmp_path, job_type="eval", same_run=True)
    kept = (tmp_path / "wandb" / RUN_ID_FILE).read_text().strip()
    assert [(kw["id"], kw["resume"]) for kw in asked] == [(kept, "allow")] * 2 and kept == kept_run_id(tmp_path)
    init_run(project="p", name="n", group="g", config={}, mode="offline", dir=tmp_path / "other")  # trainers: as before
    assert (asked[-1]["id"], asked[-1]["resume"]) == (None, None) and not (tmp_path / "other" / "wandb").exists()
    init_run(project="p", name="n", group="g", config={}, mode="disabled", dir=tmp_path / "off", same_run=True)
    assert len(asked) == 3 and not (tmp_path / "off").exists()  # logger=none: nothing written


def test_transformers_wandb_offline_notice_is_not_printed(monkeypatch, capsys):
    """transformers' W&B integration (imported with the HF Trainer) prints ``[INFO] Running in WANDB offline mode`` on
    stdout when imported under ``WANDB_MODE=offline``: once in the training process and once in each testbed arm the
    main job evaluates (four times in all), beside W&B's own offline lines. ``python -m train`` imports it first
    through :func:`import_hf_wandb_quietly`, which drops that line."""
    import importlib
    import sys

    import transformers.integrations

    from zoomr.tracking import HF_WANDB_MODULE, import_hf_wandb_quietly

    monkeypatch.setattr(transformers.integrations, "integration_utils", importlib.import_module(HF_WANDB_MODULE))
    monkeypatch.delitem(sys.modules, HF_WANDB_MODULE)  # both put back after the test: the module is imported afresh
    monkeypatch.setenv("WANDB_MODE", "offline")
    import_hf_wandb_quietly()
    assert HF_WANDB_MODULE in sys.modules
    assert "WANDB offline" not in capsys.readouterr().out


def test_only_rank_zero_of_a_distributed_launch_starts_a_wandb_run(tmp_path, monkeypatch):
    """Under ``torchrun``/``accelerate`` (DeepSpeed) every rank ran the trainer's ``start_run``, so every rank started
    a W&B run: one training on eight GPUs was eight runs of one name, seven holding only the config and summary."""
    from types import SimpleNamespace

    import wandb
    from hydra import compose, initialize_config_dir

    from zoomr.entry import CONF_DIR, start_run
    from zoomr.schemas import register_with_hydra

    asked = []
    run = SimpleNamespace(summary={}, config=SimpleNamespace(update=lambda *a, **kw: None), finish=lambda: None)
    monkeypatch.setattr(wandb, "init", lambda **kw: asked.append(kw) or run)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    register_with_hydra()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=["+method=abridge", "logger.mode=offline", f"run_dir={tmp_path / 'run'}"])
    for rank in ("1", "0"):
        monkeypatch.setenv("RANK", rank)
        _, logger = start_run(cfg, job_type="train")
        assert logger.enabled == (rank == "0") and len(asked) == int(rank == "0")


def test_the_hf_trainers_wandb_callback_does_not_leave_its_values_in_the_projects_config(tmp_path, monkeypatch):
    """With ``report_to=wandb`` the HF Trainer's W&B callback writes its ``TrainingArguments`` into the project's run
    config when training starts (``allow_val_change``): every trained run's ``run_name`` was None in W&B and its
    ``deepspeed`` lost the choice's name. The project's values are put back when the run finishes."""
    from transformers import TrainerState, TrainingArguments
    from transformers.integrations import WandbCallback

    monkeypatch.delenv("WANDB_MODE", raising=False)
    config = {"run_name": "abridge-tiny-testbed-testbed", "deepspeed": {"name": "none", "config": None}, "seed": 7}
    logger = init_run(project="p", name="n", group="g", config=config, mode="offline", dir=tmp_path, job_type="train")
    run = logger.run
    args = TrainingArguments(output_dir=str(tmp_path / "checkpoints"), report_to=[], seed=7)
    WandbCallback().setup(args, TrainerState(), None)  # what the Trainer does at on_train_begin
    assert run.config["run_name"] is None  # the HF callback's value
    logger.finish()
    assert {k: run.config[k] for k in config} == config


def test_wandb_refusing_to_start_an_online_run_is_one_line_saying_what_to_do(tmp_path, monkeypatch):
    """``logger.mode=online`` (or ``WANDB_MODE=online``) without a W&B key was wandb's ``UsageError`` traceback (after
    a trainer's run state, or an evaluation's model load); now a settings error naming the ways out."""
    import wandb

    from zoomr.schemas.checks import SettingsError

    def refuse(**kw):
        raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")

    monkeypatch.setattr(wandb, "init", refuse)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    with pytest.raises(SettingsError, match=r"W&B could not start the run in online mode \(No API key configured.*"
                                            r"WANDB_MODE=offline.*logger=none"):  # fmt: skip
        init_run(project="p", name="n", group="g", config={}, mode="online", dir=tmp_path)
