"""Every conf/method YAML of a cache policy composes against its schema and builds its policy."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from zoomr.cache import POLICIES, build_policy, match_budget, policy_config
from zoomr.cache.registry import _discover
from zoomr.models import tiny_config
from zoomr.schemas import register_with_hydra

CONF = Path(__file__).resolve().parent.parent / "conf"
_discover()
POLICY_YAMLS = sorted(p.stem for p in (CONF / "method").glob("*.yaml") if "policy:" in p.read_text())


@pytest.fixture(scope="module")
def tokenizer(cache_dir):
    from tests.conftest import tiny_spec
    from zoomr.models import load_tokenizer

    return load_tokenizer(tiny_spec("qwen2"), cache_dir)


@pytest.mark.parametrize("name", POLICY_YAMLS)
def test_policy_yaml_composes_and_builds(name, tokenizer):
    register_with_hydra()
    with initialize_config_dir(str(CONF), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"+method={name}"])
    config = policy_config(cfg.method)
    assert config.policy in POLICIES
    try:
        cache = build_policy(cfg.method, tiny_config("qwen2", vocab_size=64), tokenizer)
    except (
        FileNotFoundError
    ) as e:  # a learned policy whose trained component is not there: the error must say so
        assert "checkpoint" in str(e) or "train" in str(e), e
        return
    assert cache.num_layers == 4 and cache.kv_heads == 2


def test_bad_hyperparameters_fail_clearly():
    with pytest.raises(ValueError, match="budget_rows > n_sink"):
        policy_config({"policy": "streaming", "budget_rows": 4, "n_sink": 4})
    with pytest.raises(ValueError, match="unknown keys"):
        policy_config({"policy": "streaming", "budjet_rows": 4})
    with pytest.raises(KeyError, match="unknown cache policy"):
        policy_config({"policy": "nope"})


def test_match_budget_sets_rows():
    cfg = match_budget({"policy": "streaming", "budget_rows": 100}, 37.6)
    assert cfg.budget_rows == 38 and cfg.n_sink == 4
