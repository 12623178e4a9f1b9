"""``zoomr.configs``: a method / model config by name, as its schema dataclass, without Hydra (the README's
Python API; loading conf/method/<name>.yaml directly failed on its ``defaults`` list)."""

from __future__ import annotations

import pytest

from zoomr.cache.h2o import H2OConfig
from zoomr.cache.kvzap import KVzapMethod
from zoomr.configs import available, method_config, model_config
from zoomr.models import ModelSpec
from zoomr.schemas.checks import SettingsError

NEEDS_DATA = {"abridge_allocate"}  # its checkpoint path names the data= choice: the entry point's job


@pytest.mark.parametrize("name", sorted(set(available("method")) - NEEDS_DATA))
def test_every_method_config_loads(name):
    cfg = method_config(name)
    assert cfg.name in (name, name.replace("kvzap_linear", "kvzap"))


def test_overrides_context_and_errors():
    cfg = method_config("h2o", budget_rows=64)
    assert isinstance(cfg, H2OConfig) and cfg.budget_rows == 64 and cfg.recent == 32
    linear = method_config("kvzap_linear", model="tiny-llama")  # inherits conf/method/kvzap.yaml
    assert isinstance(linear, KVzapMethod) and linear.model_type == "linear"
    assert linear.surrogate_dir.endswith("tiny-llama")
    with pytest.raises(ValueError, match="budget_rows must be > 0"):
        method_config("streaming", budget_rows=-1)
    with pytest.raises(ValueError, match="unknown keys"):
        method_config("streaming", budget=3)
    with pytest.raises(SettingsError, match="available: .*h2o"):  # a name the user gave: printed, not a traceback
        method_config("h2o2")
    with pytest.raises(SettingsError, match="no model config 'bogus'; available: .*tiny-qwen2"):
        model_config("bogus")  # kvzap_compression --model bogus: a ValueError traceback
    with pytest.raises(ValueError, match="pass it in context"):
        method_config("abridge_allocate")


@pytest.mark.parametrize("name", available("model"))
def test_every_model_config_loads(name):
    spec = model_config(name)
    assert isinstance(spec, ModelSpec) and spec.name == name
    assert model_config(name, hf_id="runs/train/r/final").hf_id == "runs/train/r/final"


@pytest.mark.parametrize(
    ("name", "setting"),
    [("zoomr", {"budget_rows": 64}), ("sumr", {"budget_rows": 64}), ("kvzap", {"budget_rows": 64}),
     ("full", {"budget_rows": 64}), ("evict_recency", {"budget_fraction": 0.5})],
)  # fmt: skip
def test_a_budget_on_a_policy_without_one_is_refused(name, setting):
    """ZoomR, KVzap, full KV, … keep rows by their own rule: method_config("zoomr", budget_rows=64) was accepted and
    decoded without any budget (the field is PolicyConfig's, read only by the budgeted policies)."""
    with pytest.raises(SettingsError, match=f"has no row budget, so {next(iter(setting))}=.* would be ignored"):
        method_config(name, **setting)
    assert method_config("h2o", budget_rows=64).budget_rows == 64  # the budgeted policies take it
