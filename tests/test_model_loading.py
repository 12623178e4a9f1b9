"""Loading a trained checkpoint: a given ``model.hf_id`` wins over a tiny config (no ``model.tiny=null``), the
run is named after the checkpoint, and a ``zoomr_sft`` LoRA adapter reloads with its trained delimiter rows."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from tests.test_zoomr_sft import summarized  # noqa: F401, F811  (the summary-augmented traces fixture)
from zoomr.entry import CONF_DIR, model_spec
from zoomr.models import (
    ModelPathError,
    ModelSpec,
    checkpoint_name,
    local_checkpoint_problem,
    resolve_model_path,
)
from zoomr.paths import REPO_ROOT
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


def test_a_local_model_path_that_is_not_a_checkpoint_is_named(tmp_path, monkeypatch):
    """``model.hf_id=runs/train/<typo>/final`` was sent to the hub ("Repo id must be in the form …", then "point
    model.hf_id at the local directory", which the user had done); an empty directory died in tokenizer
    conversion ("You need to have sentencepiece or tiktoken installed")."""
    monkeypatch.chdir(tmp_path)
    shipped = str(REPO_ROOT / "analysis/results/miniature/base_model")
    assert local_checkpoint_problem(shipped) is None
    assert local_checkpoint_problem("Qwen/Qwen3-8B") is None and local_checkpoint_problem("gpt2") is None  # hub ids
    assert local_checkpoint_problem("runs/train/typo/final").startswith("no such directory")
    assert local_checkpoint_problem("./final").startswith("no such directory")
    (tmp_path / "empty").mkdir()
    assert "not a checkpoint directory (no config.json" in local_checkpoint_problem("empty")
    (tmp_path / "file.txt").write_text("x")
    assert local_checkpoint_problem("file.txt") == "a file, not a checkpoint directory"
    broken = tmp_path / "runs" / "broken"
    broken.mkdir(parents=True)
    (broken / "config.json").write_text("{}")
    assert "no model weights" in local_checkpoint_problem("runs/broken")
    (broken / "model.safetensors").write_bytes((Path(shipped) / "model.safetensors").read_bytes()[:1000])
    assert "truncated weights: model.safetensors" in local_checkpoint_problem("runs/broken")
    with pytest.raises(ModelPathError, match=r"model.hf_id=runs/broken: incomplete checkpoint"):
        resolve_model_path(ModelSpec(name="b", hf_id="runs/broken"))
    no_tokenizer = tmp_path / "no_tokenizer"  # weights but no tokenizer: "You need to have sentencepiece or …"
    no_tokenizer.mkdir()
    for name in ("config.json", "model.safetensors"):
        (no_tokenizer / name).write_bytes((Path(shipped) / name).read_bytes())
    from zoomr.models import load_tokenizer

    with pytest.raises(ModelPathError, match=r"no_tokenizer: no tokenizer in the checkpoint \(none of tokenizer.json"):
        load_tokenizer(ModelSpec(name="n", hf_id=str(no_tokenizer)))
    (no_tokenizer / "tokenizer_config.json").write_bytes((Path(shipped) / "tokenizer_config.json").read_bytes())
    with pytest.raises(ModelPathError, match=r"no_tokenizer: the tokenizer in the checkpoint cannot be loaded from "
                                             r"tokenizer_config.json \(Couldn't instantiate the backend tokenizer"):
        load_tokenizer(ModelSpec(name="n", hf_id=str(no_tokenizer)))  # it was transformers' traceback
    from zoomr.testbed.checkpoint import load_testbed_model

    with pytest.raises(ModelPathError, match=r"no_tokenizer: no tokenizer.json \(the testbed's word-level tokenizer\)"):
        load_testbed_model(no_tokenizer)


def test_weights_that_do_not_fit_the_config_are_refused_naming_the_keys(tmp_path, caplog):
    """A ``config.json`` with fewer layers than the weights (edited, or copied from another run) loaded with only
    transformers' load report: the evaluator ran a two-layer model and scored it as the checkpoint."""
    import json
    import re
    import shutil

    from zoomr.models import load_matching_weights, load_model

    shipped = REPO_ROOT / "analysis/results/miniature/base_model"
    assert load_matching_weights(shipped).config.num_hidden_layers == 3  # a whole checkpoint loads
    for layers, kind in ((2, "unexpected (model.layers.2."), (4, "missing (model.layers.3.")):
        ckpt = tmp_path / f"layers{layers}"
        shutil.copytree(shipped, ckpt)
        config = json.loads((ckpt / "config.json").read_text())
        (ckpt / "config.json").write_text(json.dumps({**config, "num_hidden_layers": layers}))
        with pytest.raises(ModelPathError, match=f"its weights do not match its config.json: 9 {re.escape(kind)}"):
            load_model(ModelSpec(name="x", hf_id=str(ckpt)))
    wider = tmp_path / "vocab600"  # a tensor of another shape: transformers' RuntimeError ("look at the above report")
    shutil.copytree(shipped, wider)
    config = json.loads((wider / "config.json").read_text())
    (wider / "config.json").write_text(json.dumps({**config, "vocab_size": 600}))
    with pytest.raises(ModelPathError, match=re.escape("1 of another shape (model.embed_tokens.weight: [641, 128] in "
                                                       "the weights, [600, 128] by config.json)")):
        load_model(ModelSpec(name="x", hf_id=str(wider)))
    with caplog.at_level("WARNING", logger="zoomr.models"):  # a hub model is loaded, the report logged
        model = load_matching_weights(tmp_path / "layers2", strict=False)
    assert model.config.num_hidden_layers == 2 and "9 unexpected" in caplog.text


def test_a_tokenizer_from_another_model_is_refused(tmp_path):
    """A checkpoint whose tokenizer was copied from another model (more tokens than the model has embedding rows)
    loaded without a word: ids past the rows failed in the embedding, the others named other tokens."""
    import shutil

    from transformers import AutoTokenizer

    from zoomr.models import load_tokenizer
    from zoomr.testbed.checkpoint import load_testbed_model

    shipped = REPO_ROOT / "analysis/results/miniature/base_model"
    ckpt = tmp_path / "ckpt"
    shutil.copytree(shipped, ckpt)
    other = AutoTokenizer.from_pretrained(shipped)
    other.add_tokens([f"extra{i}" for i in range(5)])
    other.save_pretrained(ckpt)
    match = r"its tokenizer has 646 tokens, its model 641 embedding rows"
    with pytest.raises(ModelPathError, match=f"model.hf_id={re.escape(str(ckpt))}: {match}"):
        load_tokenizer(ModelSpec(name="x", hf_id=str(ckpt)))
    with pytest.raises(ModelPathError, match=match):
        load_testbed_model(ckpt)
    assert len(load_tokenizer(ModelSpec(name="x", hf_id=str(shipped)))) == 641  # its own tokenizer loads


def test_eval_and_train_print_the_bad_model_path_alone(tmp_path):
    """Through the real entry points: the message, exit status 1, no traceback, and the trainer writes no run state
    (``+method=abridge`` used to ignore ``model.hf_id`` and fine-tune the shipped testbed model under its name)."""
    for entry, extra in (("eval", ["benchmark.problem_limit=1"]), ("train", ["+method=abridge"])):
        run_dir = tmp_path / entry
        proc = subprocess.run(
            [sys.executable, "-m", entry, *extra, f"model.hf_id={tmp_path / 'missing'}", "logger=none",
             f"hydra.run.dir={run_dir}"],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 1, proc.stderr[-2000:]
        assert f"model.hf_id={tmp_path / 'missing'}: no such directory" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert not (run_dir / "settings.json").exists() and not (run_dir / "fingerprint.json").exists()


def test_abridge_starts_from_model_hf_id_when_one_is_given():
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        default = compose("train", overrides=["+method=abridge"])
        given = compose("train", overrides=["+method=abridge", "model.hf_id=/ckpt/final"])
        hub = compose("train", overrides=["+method=abridge", "model=tiny-qwen2", "data=traces"])
    assert default.method.init_from == "analysis/results/miniature/base_model"  # the shipped testbed model
    assert given.method.init_from is None and hub.method.init_from is None  # start from model.hf_id / the config
    # the per-layer schedule allocated from the shipped model goes with it: another start model trains uniform
    assert default.method.schedule.endswith("mini-abridge_c256_alloc-T1024/schedule.json")
    assert given.method.schedule is None and hub.method.schedule is None


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
