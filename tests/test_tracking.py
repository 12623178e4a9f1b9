"""The W&B helper: mode resolution, secrets never uploaded, a disabled logger is a no-op."""

from __future__ import annotations

import pytest

from zoomr.tracking import RunLogger, init_run, resolve_mode, scrub_secrets


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
