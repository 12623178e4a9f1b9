"""Loading a trained checkpoint: a given ``model.hf_id`` wins over a tiny config (no ``model.tiny=null``), the
run is named after the checkpoint, and a ``zoomr_sft`` LoRA adapter reloads with its trained delimiter rows."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_dir

from tests.test_zoomr_sft import summarized  # noqa: F401, F811  (the summary-augmented traces fixture)
from zoomr.entry import CONF_DIR, model_spec
from zoomr.models import ModelSpec, checkpoint_name
from zoomr.schemas import register_with_hydra

register_with_hydra()


def _eval_cfg(*overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("eval", overrides=list(overrides))


def test_hf_id_wins_over_a_tiny_config():
    spec = ModelSpec(name="x", hf_id="runs/train/r/final", tiny={"hidden_size": 8})
    assert spec.hf_id == "runs/train/r/final" and spec.tiny is None and not spec.is_tiny
    with pytest.raises(ValueError, match="model.hf_id .* or model.tiny"):
        ModelSpec(name="x")


@pytest.mark.parametrize(
    ("hf_id", "name"),
    [
        (None, "tiny-qwen2"),
        ("runs/train/zoomr_sft-tiny-qwen2-zoomr_summaries/final", "zoomr_sft-tiny-qwen2-zoomr_summaries"),
        ("runs/train/abridge-tiny-qwen2-traces/checkpoints/checkpoint-50", "abridge-tiny-qwen2-traces-checkpoint-50"),
        ("/models/my-ckpt/", "my-ckpt"),
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "DeepSeek-R1-Distill-Qwen-7B"),
    ],
)
def test_checkpoint_name(hf_id, name):
    assert checkpoint_name("tiny-qwen2", hf_id) == name


def test_readme_zoomr_eval_line_composes_to_the_checkpoint():
    """The README's `python -m eval +method=zoomr model.hf_id=<ckpt>` failed with 'set exactly one of hf_id and
    tiny' and, with model.tiny=null alone, wrote into the random tiny model's run directory."""
    ckpt = "runs/train/zoomr_sft-tiny-qwen2-zoomr_summaries/final"
    cfg = _eval_cfg("+method=zoomr", f"model.hf_id={ckpt}")
    spec = model_spec(cfg)
    assert spec.hf_id == ckpt and not spec.is_tiny
    assert cfg.run_dir == "runs/eval/math500/zoomr_sft-tiny-qwen2-zoomr_summaries/zoomr"
    assert _eval_cfg().run_dir == "runs/eval/math500/tiny-qwen2/full"  # the tiny default is unchanged
    assert model_spec(_eval_cfg("model.hf_id=x", "model.name=mine")).name == "mine"  # an explicit name wins


@pytest.fixture(scope="module")
def sft_checkpoint(tmp_path_factory, summarized):  # noqa: F811
    from tests.test_zoomr_sft import train

    summary = train(tmp_path_factory.mktemp("run") / "run", summarized, "method.max_steps=2", "method.save_steps=2")
    return summary


def test_zoomr_sft_checkpoint_reloads_with_trained_rows(sft_checkpoint, cache_dir, capfd):
    """transformers' adapter loading reported `lm_head.token_adapter.trainable_tokens_delta | MISSING`; the
    project's loader restores the adapter through PEFT and merges it: the trained logits, no such report."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from zoomr import tokens
    from zoomr.models import adapter_base, load_model, load_tokenizer

    ckpt = sft_checkpoint["checkpoint"]
    spec = ModelSpec(name="zoomr-sft", hf_id=ckpt, tiny={"hidden_size": 256})  # tiny is ignored
    capfd.readouterr()
    model = load_model(spec, cache_dir)
    assert "MISSING" not in "".join(capfd.readouterr())
    assert not hasattr(model, "peft_config")  # merged: an ordinary model for the cache policies
    tok = load_tokenizer(spec, cache_dir)
    ids = tok(f"Step one. {tokens.BEGIN_SUMMARY} sum {tokens.END_SUMMARY} next", return_tensors="pt").input_ids
    assert set(sft_checkpoint["trainable_tokens"].values()) <= set(ids[0].tolist())
    base = AutoModelForCausalLM.from_pretrained(adapter_base(ckpt)).eval()
    trained = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(adapter_base(ckpt)), ckpt).eval()
    with torch.no_grad():
        got, want, untrained = model(ids).logits, trained(ids).logits, base(ids).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert (got - untrained).abs().max() > 1e-2  # the delimiter rows and LoRA really changed the logits
