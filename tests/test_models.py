"""Tiny models and the local tokenizer: loaders agree, save/load round-trips, hub ids fail fast."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from tests.conftest import tiny_spec
from zoomr import tokens
from zoomr.models import ModelSpec, build_tiny, describe, load_model, load_tokenizer, tiny_config
from zoomr.schemas.checks import SettingsError
from zoomr.tokenizer import special_token_ids

TEXTS = [
    "Let $x^2 + 3x = 10$. Then x = 2 or x = -5.\n\nSo the answer is \\boxed{2}.",
    f"{tokens.BEGIN_THOUGHT}\nFirst, note that 17 is prime.{tokens.BEGIN_SUMMARY} 17 prime {tokens.END_SUMMARY}",
    "Unicode: naïve café — 東京 ∑_{i=1}^{n} i² \t\ttabs  and   spaces",
    "".join(tokens.pause_token(i) for i in range(4)) + tokens.SPLITTER + tokens.lightthinker_cache_token(8),
]


def test_every_tokenizer_loader_gives_identical_ids(tiny_arch, cache_dir):
    path = build_tiny(tiny_spec(tiny_arch), cache_dir)
    auto = AutoTokenizer.from_pretrained(path)
    fast = PreTrainedTokenizerFast.from_pretrained(path)
    ours = load_tokenizer(tiny_spec(tiny_arch), cache_dir)
    for text in TEXTS:
        ids = fast(text).input_ids
        assert auto(text).input_ids == ids
        assert ours(text).input_ids == ids
        assert fast.decode(ids) == text


def test_special_tokens_are_single_ids(cache_dir):
    tok = load_tokenizer(tiny_spec("qwen2"), cache_dir)
    ids = special_token_ids(tok)
    assert len(set(ids.values())) == len(tokens.ALL_SPECIAL_TOKENS)
    for t in (tokens.BEGIN_SUMMARY, tokens.END_SUMMARY, tokens.pause_token(255), tokens.IM_END):
        assert tok(t, add_special_tokens=False).input_ids == [ids[t]]
    assert tok.eos_token == tok.pad_token == tokens.EOS


def test_chat_template_marks_assistant_turn(cache_dir):
    tok = load_tokenizer(tiny_spec("qwen2"), cache_dir)
    msgs = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "\\boxed{4}"}]
    out = tok.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    mask = out["assistant_masks"]
    assistant_ids = [i for i, m in zip(out["input_ids"], mask) if m]
    assert tok.decode(assistant_ids) == "\\boxed{4}<|im_end|>"
    prompt = tok.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")


def test_tiny_models_have_the_real_classes_and_gqa(tiny_arch, cache_dir):
    model = load_model(tiny_spec(tiny_arch), cache_dir)
    expected = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}[tiny_arch]
    assert type(model).__name__ == expected
    d = describe(model)
    assert d["heads"] // d["kv_heads"] >= 2 and d["layers"] == 4
    assert model.config.vocab_size == len(load_tokenizer(tiny_spec(tiny_arch), cache_dir))


def test_model_round_trip_gives_identical_logits(tmp_path, cache_dir):
    spec = tiny_spec("llama")
    model = load_model(spec, cache_dir)
    ids = torch.tensor([[5, 17, 99, 1024, 7]])
    with torch.no_grad():
        before = model(ids).logits
    model.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.equal(again(ids).logits, before)


def test_partial_rope_phi3_rotates_only_its_share_of_each_head(tmp_path, cache_dir):
    """``arch=phi3`` + ``partial_rotary_factor``: RoPE on the first dims of a head, the rest position-free, and
    the setting survives save/load (the ZoomR testbed variant with position-free key dims)."""
    spec = tiny_spec("phi3", partial_rotary_factor=0.5)
    model = load_model(spec, cache_dir)
    assert type(model).__name__ == "Phi3ForCausalLM"
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    assert model.model.rotary_emb.inv_freq.numel() * 2 == head_dim // 2
    cos, sin = model.model.rotary_emb(torch.zeros(1), torch.tensor([[0, 900]]))
    assert cos.shape[-1] == head_dim // 2 and not torch.allclose(cos[0, 0], cos[0, 1])
    model.save_pretrained(tmp_path)
    assert AutoModelForCausalLM.from_pretrained(tmp_path).config.rope_parameters["partial_rotary_factor"] == 0.5
    with pytest.raises(ValueError, match="partial_rotary_factor needs arch phi3"):
        tiny_config("llama", 100, partial_rotary_factor=0.5)


def test_build_is_cached_and_keyed_on_config(cache_dir):
    a = build_tiny(tiny_spec("qwen2"), cache_dir)
    assert build_tiny(tiny_spec("qwen2"), cache_dir) == a
    assert build_tiny(tiny_spec("qwen2", num_hidden_layers=2), cache_dir) != a


def test_gqa_requirement_and_spec_validation():
    # SettingsError, not ValueError: +model.tiny.num_key_value_heads=4 (or a group that does not divide, or a partial
    # rotary factor on llama) ended python -m eval / train in a traceback instead of the message
    with pytest.raises(SettingsError, match="GQA with >= 2 query heads per KV head, got num_attention_heads=4 / num_key"):
        tiny_config("llama", 100, num_attention_heads=4, num_key_value_heads=4)
    with pytest.raises(SettingsError, match="GQA"):
        tiny_config("qwen2", 100, num_attention_heads=4, num_key_value_heads=3)
    with pytest.raises(SettingsError, match="partial_rotary_factor needs arch phi3"):
        tiny_config("qwen3", 100, partial_rotary_factor=0.5)
    # a ZeroDivisionError; a model with meaningless positions; a shape error in the first forward
    with pytest.raises(SettingsError, match="num_key_value_heads=0 must be ints >= 1"):
        tiny_config("llama", 100, num_attention_heads=4, num_key_value_heads=0)
    with pytest.raises(SettingsError, match="rope_theta=0.0 must be > 0"):
        tiny_config("llama", 100, rope_theta=0.0)
    with pytest.raises(SettingsError, match=r"partial_rotary_factor=1.5 must be in \[0, 1\]"):
        tiny_config("phi3", 100, partial_rotary_factor=1.5)
    with pytest.raises(ValueError, match="set model.hf_id"):
        ModelSpec(name="x", arch="qwen2")
    with pytest.raises(ValueError, match="arch"):
        ModelSpec(name="x", arch="gpt2", tiny={})


def test_a_tiny_override_no_config_reads_is_refused():
    """model_config("tiny-qwen2", tiny={"num_hidden_layer": 2}) (or +model.tiny.num_hidden_layer=2) built the
    default 4-layer model: transformers keeps any keyword as an attribute nobody reads."""
    from zoomr.configs import model_config
    from zoomr.schemas.checks import SettingsError

    with pytest.raises(SettingsError, match=r"model.tiny has keys no llama config reads: \['num_hidden_layer'\]"):
        model_config("tiny-testbed", tiny={"num_hidden_layer": 2})
    with pytest.raises(SettingsError, match="no qwen2 config reads"):
        tiny_spec("qwen2", num_layers=2)
    spec = tiny_spec("phi3", partial_rotary_factor=0.5, head_dim=32, tie_word_embeddings=False)  # keys it reads
    assert spec.tiny["head_dim"] == 32 and model_config("tiny-testbed").tiny["num_hidden_layers"] == 3


def test_tiny_rope_parameters_are_kept():
    """model.tiny.rope_parameters (e.g. linear scaling) was replaced by the default RoPE without a word: the model
    was built, and named, as if scaled."""
    from transformers import AutoModelForCausalLM

    config = tiny_config("llama", 100, hidden_size=64, num_hidden_layers=1, rope_theta=500.0,
                         rope_parameters={"rope_type": "linear", "factor": 4.0})  # fmt: skip
    assert config.rope_parameters == {"rope_type": "linear", "rope_theta": 500.0, "factor": 4.0}
    assert AutoModelForCausalLM.from_config(config).model.rotary_emb.rope_type == "linear"
    assert tiny_config("llama", 100).rope_parameters == {"rope_type": "default", "rope_theta": 10000.0}


@pytest.mark.parametrize(
    ("rope", "message"),
    [({"rope_type": "bogus"}, r"rope_type='bogus' is not one of \['default', 'dynamic', 'linear'"),
     ({"rope_type": "linear"}, r"Missing required keys .* \{'factor'\}"),
     ({"factor": 4.0}, r"Unrecognized keys .*'rope_type'='default': \{'factor'\} \(no RoPE of this type reads them\)")],
)
def test_tiny_rope_parameters_transformers_would_not_build_are_refused(rope, message):
    """An unknown rope_type or a missing factor was a KeyError traceback after the tokenizer was trained; a factor
    without a rope_type built an unscaled model, only a transformers warning saying so."""
    with pytest.raises(SettingsError, match=message):
        tiny_config("llama", 100, rope_parameters=rope)


def test_building_a_tiny_config_leaves_the_spec_as_it_was(tmp_path):
    """The config class filled the spec's own ``rope_parameters`` dict in place with its default rope_theta, so in a
    process that resolved the model twice (the tokenizer, then the model) the second time named another cache
    directory and built a model with rope_theta 10000 instead of the spec's 500, without a word."""
    from zoomr.models import _tiny_dir

    spec = tiny_spec("llama", rope_theta=500.0, rope_parameters={"rope_type": "linear", "factor": 4.0})
    where = _tiny_dir(spec, tmp_path)
    for _ in range(2):
        config = tiny_config(spec.arch, 100, **spec.tiny)
        assert config.rope_parameters == {"rope_type": "linear", "rope_theta": 500.0, "factor": 4.0}
    assert spec.tiny["rope_parameters"] == {"rope_type": "linear", "factor": 4.0} and _tiny_dir(spec, tmp_path) == where


def test_a_cached_tiny_model_built_otherwise_than_its_spec_is_built_again(tmp_path, cache_dir, caplog):
    """A tiny model built before model.tiny.rope_parameters was applied (4cab432) is cached unscaled under its scaled
    spec's name, and was loaded as it was: an unscaled model for a scaled spec, without a word. Loading now compares
    the cached config with the spec's and builds the model again in its place (same directory) when they differ."""
    import json
    import shutil
    from pathlib import Path

    from transformers import AutoConfig

    from zoomr.models import load_tokenizer_dir

    tokenizers = load_tokenizer_dir(Path(cache_dir), 4096)  # the shared cache's (trained once), not trained again
    shutil.copytree(tokenizers, tmp_path / "tokenizers" / tokenizers.name)
    spec = tiny_spec("llama", hidden_size=64, intermediate_size=128, num_hidden_layers=1, rope_theta=500.0,
                     rope_parameters={"rope_type": "linear", "factor": 4.0})  # fmt: skip
    out = build_tiny(spec, tmp_path)
    written = (out / "config.json").stat().st_mtime_ns
    assert build_tiny(spec, tmp_path) == out and (out / "config.json").stat().st_mtime_ns == written  # kept as is
    config = json.loads((out / "config.json").read_text())
    config["rope_parameters"] = {"rope_theta": 500.0, "rope_type": "default"}  # as the code before 4cab432 built it
    (out / "config.json").write_text(json.dumps(config))
    with caplog.at_level("WARNING", logger="zoomr.models"):
        assert build_tiny(spec, tmp_path) == out
    assert "built with rope_parameters={'rope_theta': 500.0, 'rope_type': 'default'} where the spec gives" in caplog.text
    assert AutoConfig.from_pretrained(out).rope_parameters == {"rope_type": "linear", "rope_theta": 500.0, "factor": 4.0}
    assert sorted(p.name for p in (tmp_path / "tiny").iterdir()) == [out.name]


def test_real_model_id_fails_fast_with_clear_message():
    code = (
        "from zoomr.models import ModelSpec, load_tokenizer\n"
        "load_tokenizer(ModelSpec(name='r1', arch='qwen2', hf_id='deepseek-ai/DeepSeek-R1-Distill-Qwen-7B'))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0
    assert time.time() - t0 < 60
    assert "could not load model 'r1'" in proc.stderr
    assert "HF_HUB_OFFLINE=1" in proc.stderr and "tiny" in proc.stderr


@pytest.mark.slow  # model-loading subprocesses: CI stays under 15 min on a slow day
def test_a_hub_model_out_of_reach_ends_an_entry_point_with_its_message_alone(tmp_path):
    """``python -m eval model=qwen3-8b`` offline ended in three chained tracebacks (huggingface_hub, transformers,
    ours) around the message; it is a missing input like a missing local checkpoint."""
    from zoomr.models import ModelUnavailable
    from zoomr.paths import REPO_ROOT, MissingInput

    assert issubclass(ModelUnavailable, MissingInput)
    run_dir = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-m", "eval", "model=qwen3-8b", "benchmark.problem_limit=1",
                           f"run_dir={run_dir}"], capture_output=True, text=True, env=env, timeout=120,
                          cwd=REPO_ROOT)  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "could not load model 'qwen3-8b' from 'Qwen/Qwen3-8B'" in proc.stderr and "model.hf_id" in proc.stderr
    assert not run_dir.exists()
