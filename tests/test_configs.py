"""Every YAML under conf/ composes (litgpt-style), schemas reject bad keys/types, and the CLI lists options."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from zoomr.entry import CONF_DIR
from zoomr.schemas import register_with_hydra

CONF = Path(CONF_DIR)
PRIMARY = sorted(p.stem for p in CONF.glob("*.yaml"))
# Which primary configs take each group. A new group must be added here, so it is covered by the test.
GROUP_ENTRIES = {
    "method": ["train", "eval"],
    "model": ["train", "eval", "data_prep", "analysis"],
    "data": ["train", "data_prep"],
    "logger": ["train", "eval", "data_prep", "analysis"],
    "deepspeed": ["train"],
    "benchmark": ["eval"],
    "pipeline": ["data_prep"],
    "task": ["analysis"],
    "hydra/launcher": ["train", "eval", "data_prep", "analysis"],
}
# Groups chosen with '+group=' (no default in the primary config).
NO_DEFAULT = {"method", "pipeline", "task"}

register_with_hydra()


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def groups() -> list[str]:
    found = {str(p.parent.relative_to(CONF)) for p in CONF.rglob("*.yaml") if p.parent != CONF}
    return sorted(found)


def _compose(primary: str, overrides: list[str]):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(primary, overrides=overrides, return_hydra_config=True)


def _has_default(primary: str, group: str) -> bool:
    text = (CONF / f"{primary}.yaml").read_text()
    return f"- {group}:" in text or f"- override {group}:" in text or group == "hydra/launcher"


def _override(group: str, option: str, primary: str = "train") -> str:
    plus = group in NO_DEFAULT or not _has_default(primary, group)
    return f"{'+' if plus else ''}{group}={option}"


def test_every_group_is_known():
    unknown = set(groups()) - set(GROUP_ENTRIES)
    assert not unknown, f"add these config groups to GROUP_ENTRIES: {unknown}"


@pytest.mark.parametrize("group", sorted(GROUP_ENTRIES))
def test_every_option_of_every_group_composes(group):
    entries = [e for e in GROUP_ENTRIES[group] if e in PRIMARY]
    for option in options(group):
        for entry in entries:
            extra = ["+method=sft"] if entry == "train" and group != "method" else []
            cfg = _compose(entry, [_override(group, option, entry), *extra])
            node = cfg.hydra.launcher if group == "hydra/launcher" else cfg[group]
            assert node is not None


def test_method_x_model_for_training():
    """Every method composes with every model, and the method's interpolations (e.g. KVzap's
    ``surrogate_dir: runs/kvzap/${model.name}``) resolve against it."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):  # one context: ~10x faster
        for method, model in itertools.product(options("method"), options("model")):
            cfg = compose("train", overrides=[f"+method={method}", f"model={model}"])
            assert cfg.method.name and cfg.model.name == model
            assert OmegaConf.to_container(cfg.method, resolve=True)["name"] == cfg.method.name


def test_every_launcher_composes_for_training():
    """The launchers read nothing of the method or model (environment variables and Hydra's own keys only), so one
    method and model stand for all (the full product took ~90 s of CI)."""
    launchers = ["basic", *options("hydra/launcher"), "submitit_local"]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        for launcher in launchers:
            cfg = compose("train", overrides=["+method=sft", f"hydra/launcher={launcher}"], return_hydra_config=True)
            expected = {"basic": "BasicLauncher", "submitit_local": "LocalLauncher"}.get(launcher, "SlurmLauncher")
            assert cfg.hydra.launcher._target_.endswith(expected)
            assert "${method" not in str(OmegaConf.to_container(cfg.hydra.launcher))
            assert "${model" not in str(OmegaConf.to_container(cfg.hydra.launcher))


def test_schema_rejects_unknown_keys_and_wrong_types():
    with pytest.raises((ConfigCompositionException, ConfigKeyError)):
        _compose("train", ["+method=sft", "method.not_a_field=1"])
    with pytest.raises((ConfigCompositionException, ValidationError)):
        _compose("train", ["+method=sft", "method.max_steps=lots"])
    with pytest.raises((ConfigCompositionException, ConfigKeyError)):
        _compose("train", ["+method=sft", "model.hidden=3"])


def _run_train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "train", *args], capture_output=True, text=True, timeout=120)


def test_unknown_method_lists_the_available_ones():
    proc = _run_train("+method=nope")
    assert proc.returncode != 0
    assert "Could not find 'method/nope'" in proc.stderr
    for m in options("method"):
        assert m in proc.stderr


def test_missing_method_names_the_choices():
    proc = _run_train()
    assert proc.returncode != 0
    assert "python -m train +method=<name>" in proc.stderr
    assert "sft" in proc.stderr


@pytest.mark.parametrize("entry,group", [("analysis", "task"), ("data_prep", "pipeline")])
def test_other_entry_points_name_their_choices(entry, group):
    proc = subprocess.run([sys.executable, "-m", entry], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert f"python -m {entry} +{group}=<name>" in proc.stderr
    for option in options(group):
        assert option in proc.stderr


def test_every_analysis_task_names_a_module_with_main():
    import importlib

    for option in options("task"):
        cfg = _compose("analysis", [f"+task={option}"])
        assert callable(importlib.import_module(f"analysis.{cfg.task.module}").main)
