"""LightThinker training end to end on tiny models: config, run, resume guard, start from a testbed checkpoint."""

from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_dir

from zoomr.cache.lightthinker import LightThinkerMethod
from zoomr.entry import CONF_DIR
from zoomr.schemas import register_with_hydra, to_dataclass

TINY_RUN = [
    "method.max_steps=4",
    "method.per_device_batch_size=2",
    "method.max_response_tokens=96",
    "method.num_cache_tokens=4",
    "method.heldout_examples=2",
    "method.logging_steps=1",
    "method.eval_steps=2",
    "method.save_steps=2",
    "data.max_samples=8",
    "logger=none",
]


def _compose(overrides: list[str], run_dir=None):
    register_with_hydra()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        extra = [f"run_dir={run_dir}", "hydra.runtime.output_dir=."] if run_dir else []
        return compose("train", overrides=["+method=lightthinker", *overrides, *extra])


def test_config_composes_into_its_schema():
    m = to_dataclass(LightThinkerMethod, _compose([]).method)
    assert m.trainer == "lightthinker" and m.policy == "lightthinker" and m.num_cache_tokens is None
    with pytest.raises(Exception, match="num_cache_token"):
        _compose(["method.num_cache_token=3"])  # a typo fails at compose time


def test_train_on_traces_and_refuse_a_resume_with_another_layout(tmp_path, cache_dir, monkeypatch):
    import train.lightthinker as recipe

    run_dir = tmp_path / "run"
    logged, start = {}, recipe.start_run  # W&B's summary: the splitter figures were text only (no number reached it)

    def start_run(*args, **kwargs):
        run, logger = start(*args, **kwargs)
        logger.summary = logged.update
        return run, logger

    monkeypatch.setattr(recipe, "start_run", start_run)
    first = recipe.run(_compose([*TINY_RUN, f"cache_dir={cache_dir}"], run_dir))
    monkeypatch.undo()
    split = first["heldout_splitter"]  # "recall 0.00, precision 0.00 (teacher-forced argmax at 1 splitters)"
    assert f"recall {logged['heldout_splitter_recall']:.2f}, precision {logged['heldout_splitter_precision']:.2f} " \
           f"(teacher-forced argmax at {logged['heldout_splitter_splitters']} splitters)" == split
    assert logged["steps"] == 4 and logged["heldout_ce_full_kv"] == first["heldout_ce_full_kv"]
    assert first["steps"] == 4 and first["resumed_from"] == "-"
    assert first["loss_end"] < first["loss_start"]
    assert first["heldout_ce_lightthinker"] > 0 and first["heldout_ce_full_kv"] > 0
    assert first["heldout_splitter"].startswith("recall ")
    assert "thoughts" in first["thoughts"] and first["tokens_added"] == 0
    saved = json.loads((run_dir / "final" / "lightthinker.json").read_text())
    assert saved["num_cache_tokens"] == 4 and saved["data"] == "traces"
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 4
    with pytest.raises(SystemExit, match="num_cache_tokens"):
        recipe.run(_compose([*TINY_RUN, "method.num_cache_tokens=3", f"cache_dir={cache_dir}"], run_dir))


def test_train_from_a_testbed_checkpoint_with_paragraphs_as_thoughts(tmp_path, cache_dir):
    import train.lightthinker as recipe
    from zoomr.entry import model_spec
    from zoomr.models import load_model_and_tokenizer

    testbed = ["model=tiny-testbed", "data=testbed", "data.n_train=8", "data.trace_tokens=160"]
    base = tmp_path / "testbed-base"
    model, tok = load_model_and_tokenizer(model_spec(_compose(testbed)), cache_dir)
    model.save_pretrained(base)
    tok.save_pretrained(base)
    keep = [o for o in TINY_RUN if not any(k in o for k in ("num_cache", "max_samples", "max_response"))]
    overrides = [*testbed, *keep, "method.max_response_tokens=200", f"method.init_from={base}", f"cache_dir={cache_dir}"]
    with pytest.raises(ValueError, match="thought_splitter=true"):  # the environment writes every break
        recipe.run(_compose(overrides, tmp_path / "refused"))
    out = recipe.run(_compose([*overrides, "data.thought_splitter=true"], tmp_path / "run"))
    assert out["steps"] == 4 and out["cache_tokens"].startswith("n=7 ")  # llama: the paper's 7
    assert not out["thoughts"].startswith("0 thoughts")
    # served with the environment's script: each held-out trace decodes exactly its response, to <|im_end|>
    from zoomr.testbed.task import TokenExamples

    examples = TokenExamples({"trace_tokens": 160, "n_train": 8, "thought_splitter": True}, tok)
    assert out["served_tokens"] == sum(len(examples[i][1]) for i in range(2))
    final = tmp_path / "run" / "final"
    assert json.loads((final / "lightthinker.json").read_text())["data"] == "testbed"
    assert json.loads((final / "data.json").read_text())["thought_splitter"] is True
