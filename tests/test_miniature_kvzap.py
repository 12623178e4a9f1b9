"""analysis/miniature_kvzap.py: every KVzap command of the miniature composes with Hydra as written."""

from __future__ import annotations

import re

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from analysis.miniature_kvzap import ARMS, BASE_TRAIN, EVAL_COMMON, MODELS, THRESHOLDS
from zoomr.cache import policy_config
from zoomr.entry import CONF_DIR
from zoomr.schemas import register_with_hydra

BASE = "runs/train/sft_testbed-tiny-testbed-testbed/final"


def _compose(entry: str, overrides: list[str]):
    register_with_hydra()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(entry, overrides=[o.format(base=BASE) for o in overrides])


def test_models_compose_in_order():
    base = _compose("train", BASE_TRAIN)
    assert base.method.name == "sft_testbed" and base.model.tiny.num_hidden_layers == 3
    assert base.data.query_form == "cue" and not base.data.summaries
    pairs = _compose(MODELS["kvzap_pairs"]["entry"], MODELS["kvzap_pairs"]["overrides"])
    assert pairs.pipeline.testbed.seed not in (base.data.test_seed, 2_000_003)
    assert pairs.model.hf_id == BASE
    fit = _compose(MODELS["kvzap_surrogates"]["entry"], MODELS["kvzap_surrogates"]["overrides"])
    assert fit.method.trainer == "kvzap" and MODELS["kvzap_surrogates"]["after"] == ["kvzap_pairs"]
    assert fit.method.pairs_dir == pairs.pipeline.out_dir  # the fit reads what the pipeline writes


def test_arms_are_named_and_compose():
    assert len(THRESHOLDS) >= 4
    names = {n for n in ARMS if n != "kvzip"}
    assert names == {f"{k}@{t:g}" for k in ("kvzap", "kvzap_linear") for t in THRESHOLDS}
    run_names = set()
    for name, overrides in ARMS.items():
        cfg = _compose("eval", [*EVAL_COMMON, *overrides])
        method = OmegaConf.to_container(cfg.method, resolve=True)
        policy_config(method)  # the schema's own checks
        kind = name.split("@")[0]
        assert method["name"] == kind and cfg.benchmark.name == "testbed"
        if kind != "kvzip":
            assert method["threshold"] == float(name.split("@")[1]) and method["decoding"] and method["window"] == 128
            assert method["model_type"] == ("linear" if kind == "kvzap_linear" else "mlp")
        assert cfg.generation.temperature == 0 and cfg.generation.max_new_tokens == 1100
        run_names.add(cfg.run_name)
        assert re.fullmatch(r"[\w.-]+", cfg.run_name), cfg.run_name  # safe as a directory name
    assert len(run_names) == len(ARMS)  # no two arms share a run directory


@pytest.mark.parametrize("arm", ["kvzap@-5", "kvzap_linear@-5"])
def test_surrogate_dir_is_where_the_fit_writes(arm):
    fit = _compose("train", MODELS["kvzap_surrogates"]["overrides"])
    cfg = _compose("eval", [*EVAL_COMMON, *ARMS[arm]])
    assert cfg.method.surrogate_dir == fit.method.surrogate_dir
