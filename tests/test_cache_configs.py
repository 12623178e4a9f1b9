"""Every conf/method YAML of a cache policy composes against its schema and builds its policy."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from zoomr.cache import POLICIES, build_policy, match_budget, policy_config
from zoomr.cache.registry import registered
from zoomr.configs import available, load_config, schema_of
from zoomr.models import tiny_config
from zoomr.schemas import register_with_hydra

CONF = Path(__file__).resolve().parent.parent / "conf"
CONFIGS = registered()  # every policy of zoomr/cache/ and its config dataclass
MODEL = {"model": {"name": "tiny-qwen2"}}
# a YAML names a policy when its schema (followed through same-group defaults) is a policy's config
POLICY_YAMLS = [n for n in available("method") if schema_of("method", n) in CONFIGS.values()]


def test_every_policy_has_a_yaml_and_every_yaml_its_policy():
    """Litgpt-style: the set of policy YAMLs and the registry agree (a policy nobody can select, or a YAML
    whose schema is no registered policy, fails here)."""
    covered = {load_config("method", n, MODEL).policy for n in POLICY_YAMLS}
    assert covered == set(CONFIGS), f"policies without a YAML: {sorted(set(CONFIGS) - covered)}"
    assert {"h2o", "evict_random", "sumr", "kvzip", "abridge", "lightthinker"} <= set(POLICY_YAMLS)


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
    assert type(config) is CONFIGS[config.policy] and config.name == cfg.method.name
    assert config.name == name  # the run label: the YAML file, without a name or policy line repeating it
    try:
        cache = build_policy(config, tiny_config("qwen2", vocab_size=64), tokenizer)
    except (FileNotFoundError, ValueError) as e:  # a learned policy without its trained part: the error says so
        assert "checkpoint" in str(e) or "train" in str(e), e
        return
    assert type(cache) is POLICIES[config.policy]
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
