"""Trainers on data and models that would give a wrong model without a word (fast: toy models, in-process)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch


class Toy(torch.nn.Module):
    """A one-weight "model" whose loss is its weight squared (the HF ``Trainer`` contract: ``.loss``)."""

    def __init__(self, weight: float):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([weight]))

    def forward(self, x=None, **_):
        return {"loss": (self.w * x).pow(2).sum()}


def toy_trainer(tmp_path: Path, weight: float, steps: int = 3):
    from transformers import Trainer, TrainingArguments

    from zoomr.training import LogAtSave, trainer_arguments

    method = SimpleNamespace(
        per_device_batch_size=1, gradient_accumulation_steps=1, learning_rate=1e-2, weight_decay=0.0,
        max_grad_norm=1.0, max_steps=steps, logging_steps=10, save_steps=1, save_total_limit=5, bf16=False,
        gradient_checkpointing=False,
    )  # fmt: skip
    args = TrainingArguments(**trainer_arguments(method, method, tmp_path / "checkpoints", 0, [], None), use_cpu=True)
    rows = [{"x": torch.ones(1)} for _ in range(steps)]
    return Trainer(model=Toy(weight), args=args, train_dataset=rows, callbacks=[LogAtSave()])


def test_a_run_whose_loss_is_nan_stops_naming_it_and_saves_no_nan_checkpoint(tmp_path):
    """A start model with a NaN weight: HF's NaN filter logged loss 0 at every step and the run saved its NaN
    weights as checkpoints (the SFT summary read loss_start = loss_end = 0.0)."""
    from zoomr.rundir import RunPlan
    from zoomr.training import train_or_restore

    trainer = toy_trainer(tmp_path, float("nan"))
    with pytest.raises(SystemExit, match=r"training diverged: loss nan, grad_norm nan at step 1"):
        train_or_restore(trainer, RunPlan(run_dir=tmp_path, extent={}), 3)
    assert not list((tmp_path / "checkpoints").glob("checkpoint-*"))


def test_a_finite_run_logs_and_saves_as_before(tmp_path):
    from zoomr.rundir import RunPlan
    from zoomr.training import train_or_restore, training_losses

    trainer = toy_trainer(tmp_path, 1.0)
    train_or_restore(trainer, RunPlan(run_dir=tmp_path, extent={}), 3)
    losses = training_losses(trainer)
    assert losses["steps"] == 3 and 0 < losses["loss_end"] < losses["loss_start"] == pytest.approx(1.0)
    assert len(list((tmp_path / "checkpoints").glob("checkpoint-*"))) == 3


def compose_train(tmp_path: Path, *overrides: str):
    from hydra import compose, initialize_config_dir

    from zoomr.entry import CONF_DIR
    from zoomr.models import default_cache_dir
    from zoomr.schemas import register_with_hydra

    register_with_hydra()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose("train", overrides=[*overrides, f"run_dir={tmp_path / 'run'}", "hydra.runtime.output_dir=.",
                                           f"cache_dir={default_cache_dir()}", "logger=none"])  # fmt: skip


def traces_file(path: Path, responses: list[str], questions: list[str] | None = None) -> Path:
    import json

    questions = questions or [f"What is {i} + {i}?" for i in range(len(responses))]
    rows = [{"idx": i, "question": q, "code": [r]} for i, (q, r) in enumerate(zip(questions, responses))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_abridge_on_responses_that_never_complete_a_block_is_refused_before_any_state(tmp_path):
    """Every response shorter than method.block_size: no pause token anywhere, so the run trained plain full KV
    and reported heldout_ce_abridge == heldout_ce_full_kv without a word."""
    import train.abridge as recipe
    from zoomr.schemas.checks import SettingsError

    short = traces_file(tmp_path / "short.jsonl", [f"<|begin_of_thought|> {2 * i} <|end_of_thought|>" for i in range(4)])
    cfg = compose_train(
        tmp_path, "+method=abridge", "model=tiny-qwen2", "data=traces", f"data.path={short}", "method.quota=null",
        "method.block_size=32", "method.num_pause=4", "method.max_response_tokens=64", "method.heldout_examples=1",
        "method.max_steps=2",
    )  # fmt: skip
    with pytest.raises(SettingsError, match=r"no training response is longer than method.block_size=32 tokens"):
        recipe.run(cfg)
    assert not (tmp_path / "run").exists()


PLAIN_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_with_template(tmp_path: Path, template: str | None) -> Path:
    """The tiny qwen2 checkpoint (its weights linked) with another chat template, or none."""
    from zoomr.models import build_tiny, default_cache_dir, tiny_spec

    src, dst = Path(build_tiny(tiny_spec("qwen2"), default_cache_dir())), tmp_path / "model"
    dst.mkdir()
    for f in src.iterdir():
        if f.name != "chat_template.jinja":
            (dst / f.name).symlink_to(f)
    if template is not None:
        (dst / "chat_template.jinja").write_text(template)
    return dst


@pytest.mark.parametrize(
    "template,refusal",
    [(None, r"model \w+: its tokenizer has no chat template"),
     (PLAIN_CHATML, r"method.assistant_only_loss=true: the chat template of model \w+ marks no assistant turn")],
    ids=["none", "no-generation-markers"],
)  # fmt: skip
def test_sft_with_a_chat_template_it_cannot_train_is_refused_before_any_state(tmp_path, template, refusal):
    """No template: a transformers ValueError traceback; a template without {% generation %} markers that TRL cannot
    patch: a TRL ValueError traceback from the trainer's constructor, after config.json and settings.json."""
    import train.sft as recipe
    from zoomr.schemas.checks import SettingsError

    model = tiny_with_template(tmp_path, template)
    cfg = compose_train(tmp_path, "+method=sft", f"model.hf_id={model}", "data.max_samples=2", "method.max_steps=1")
    with pytest.raises(SettingsError, match=refusal):
        recipe.run(cfg)
    assert not (tmp_path / "run").exists()


def test_masked_trainers_on_chat_rows_with_a_tokenizer_without_a_chat_template_refuse_it(tmp_path):
    """AbridgeKV and LightThinker render the prompt of chat rows with the chat template (zoomr.abridge.data): a
    tokenizer without one was a transformers ValueError traceback."""
    import train.abridge as recipe
    from zoomr.schemas.checks import SettingsError

    model = tiny_with_template(tmp_path, None)
    cfg = compose_train(
        tmp_path, "+method=abridge", "model=tiny-qwen2", f"model.hf_id={model}", "data=traces", "data.max_samples=3",
        "method.quota=null", "method.block_size=8", "method.num_pause=4", "method.heldout_examples=1",
        "method.max_steps=1",
    )  # fmt: skip
    with pytest.raises(SettingsError, match=r"tokenizer of the model \(.*\) has no chat template"):
        recipe.run(cfg)
    assert not (tmp_path / "run").exists()


def synthetic_pairs(out: Path, n: int = 64, dim: int = 8, heads: int = 2, edit=None) -> Path:
    """A one-layer KVzap pairs directory (the pipeline's format) whose targets are linear in h; ``edit(split, h, y)``
    changes a split's tensors in place before they are written."""
    import json

    from zoomr.kvzap.pairs import FORMAT, shard_name, write_shard

    out.mkdir()
    gen, shards = torch.Generator().manual_seed(0), []
    for split in ("train", "val"):
        h = torch.randn(n, dim, generator=gen)
        y = h[:, :heads] * 0.5 - 8
        if edit is not None:
            edit(split, h, y)
        write_shard(out / shard_name(split, 0), {"h.0": h, "y.0": y, "y_kvzip.0": y.clone(),
                                                 "doc": torch.zeros(n, dtype=torch.long), "pos": torch.arange(n)})
        shards.append({"file": shard_name(split, 0), "split": split})
    model = {"name": "tiny-qwen2", "layers": 1, "hidden": dim, "kv_heads": heads}
    manifest = {"format": FORMAT, "model": model, "n_pairs": {"train": n, "val": n}, "shards": shards}
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def test_kvzap_pairs_holding_a_nan_are_refused_naming_the_shard(tmp_path):
    """One NaN in one training hidden state: the ridge fit was NaN everywhere and was saved as the surrogate, its
    held-out R² reported as 0.0 (squared_pearson's 'constant' branch), without a word."""
    from zoomr.jsonl import BadRowError
    from zoomr.kvzap.fit import fit_surrogates

    def nan_in_train(split, h, y):
        if split == "train":
            h[3, 2] = float("nan")

    pairs = synthetic_pairs(tmp_path / "pairs", edit=nan_in_train)
    with pytest.raises(BadRowError, match=r"shard-train-00000.safetensors: pairs with a NaN or infinite value \(1 in h.0"):
        fit_surrogates(pairs, kinds=("linear",), progress=False)


def test_kvzap_fit_on_a_head_with_a_constant_target_reports_its_r2_undefined_not_zero(tmp_path):
    """Head 1's held-out target never varies: its R² was 0.0 although the ridge predicts it exactly (MSE 0) and
    its determination 1.0 (the MLP's -inf): both pulled the layer and summary means down (-inf) without a word."""
    import json
    import math

    import train.kvzap as recipe

    def flat_head(split, h, y):
        if split == "val":
            y[:, 1] = -8.0

    pairs = synthetic_pairs(tmp_path / "pairs", edit=flat_head)
    cfg = compose_train(tmp_path, "+method=kvzap", "model=tiny-qwen2", f"method.pairs_dir={pairs}",
                        f"method.surrogate_dir={tmp_path / 'surrogates'}", "method.fit.epochs=1")  # fmt: skip
    summary = recipe.run(cfg)
    rows = json.loads((tmp_path / "run" / "r2.json").read_text())
    assert all(math.isnan(r["r2"]) and math.isnan(r["det"]) for r in rows if r["head"] == 1)
    head0 = {r["kind"]: r for r in rows if r["head"] == 0}
    for kind in ("linear", "mlp"):  # the means are those of the heads that have an R²
        assert summary[f"r2_{kind}"] == pytest.approx(head0[kind]["r2"])
        assert summary[f"det_{kind}"] == pytest.approx(head0[kind]["det"])
    assert summary["r2_linear"] > 0.99 and summary["r2_constant"] == 0.0
    assert summary["heads_constant_target"].startswith("1 of 2 (layer 0 head 1): held-out target constant")


def test_allocating_a_model_of_fewer_than_three_layers_is_refused_before_any_state(tmp_path):
    """A 2-layer uniform AbridgeKV model: no layer is doubled or halved below 3 layers, so the allocation measured
    every layer, wrote the uniform schedule it started from and printed it as the next per-layer training run."""
    import json

    import train.abridge_allocate as allocate
    from zoomr.schemas.checks import SettingsError

    ckpt = tmp_path / "final"
    ckpt.mkdir()
    layout = {"block_size": 8, "num_pause": 4, "code_positions": "spread"}
    (ckpt / "abridge.json").write_text(json.dumps({"layout": layout, "quotas": [2, 2], "heldout_examples": 2}))
    cfg = compose_train(tmp_path, "+method=abridge_allocate", "model=tiny-qwen2", "data=traces",
                        f"method.checkpoint={ckpt}")  # fmt: skip
    with pytest.raises(SettingsError, match=r"a model of 2 layer\(s\) cannot be allocated .* its own uniform \[2, 2\]"):
        allocate.run(cfg)
    assert not (tmp_path / "run").exists()


def test_sft_says_how_many_rows_max_length_cuts_and_drops(tmp_path, caplog):
    """TRL cuts every row at method.max_length and drops those whose prompt fills it without a word: the summary
    read 'traces (6 examples)' for a run that trained on 4 rows, 2 of them without their end."""
    import train.sft as recipe

    short, long = "<|begin_of_thought|> 4 <|end_of_thought|>", "<|begin_of_thought|>" + " x" * 300 + "<|end_of_thought|>"
    rows = traces_file(tmp_path / "mixed.jsonl", [short, short, long, long, short, short],
                       ["word " * 200] * 2 + ["Add 2 and 2."] * 4)  # fmt: skip
    cfg = compose_train(tmp_path, "+method=sft", "data=traces", f"data.path={rows}", "method.max_length=64",
                        "method.max_steps=1", "method.per_device_batch_size=4")  # fmt: skip
    summary = recipe.run(cfg)
    assert summary["max_length_cut"].startswith("2 of 4 training rows reach method.max_length=64 and are cut there")
    assert summary["max_length_dropped"] == "2 of 6 training rows dropped: their prompt fills method.max_length=64"
    assert summary["max_length_cut"] in caplog.text



def test_testbed_training_whose_loss_is_nan_stops_before_the_step_and_saves_nothing(tmp_path):
    """The testbed trainer's own loop (+method=sft_testbed) from a start model with a NaN weight: it stepped on,
    saved NaN checkpoints and final/ and printed a finished summary."""
    import shutil

    from safetensors.torch import load_file, save_file

    import train.testbed_pretrain as recipe
    from tests.test_train_resume import TB_TINY
    from zoomr.paths import REPO_ROOT

    start = shutil.copytree(REPO_ROOT / "analysis/results/miniature/base_model", tmp_path / "start")
    weights = load_file(start / "model.safetensors")
    next(w for k, w in weights.items() if k.endswith("mlp.down_proj.weight"))[0, 0] = float("nan")
    save_file(weights, start / "model.safetensors", metadata={"format": "pt"})
    cfg = compose_train(tmp_path, *TB_TINY, f"method.init_from={start}", "method.save_every=1")
    with pytest.raises(SystemExit, match=r"training diverged: loss nan, grad_norm nan at step 1; stopped before"):
        recipe.run(cfg)
    assert not list((tmp_path / "run").glob("checkpoints/step-*")) and not (tmp_path / "run" / "final").exists()


@pytest.mark.parametrize(
    "attn,refusal",
    [("bogus", r"model.attn_implementation=bogus: not one of eager, .*sdpa"),
     ("flash_attention_2", r"model.attn_implementation=flash_attention_2: FlashAttention runs on CUDA GPUs only")],
)  # fmt: skip
def test_an_attention_this_machine_cannot_run_is_refused_naming_the_setting(tmp_path, attn, refusal):
    """``model.attn_implementation=bogus``: transformers' ValueError traceback listing its choices; ``flash_attention_2``
    on a machine without a GPU: an ImportError traceback saying the package was missing (whether or not it was).
    Now the setting named in one line, before any run state."""
    import torch

    import train.sft as recipe
    from zoomr.schemas.checks import SettingsError

    if attn.startswith("flash") and torch.cuda.is_available():
        pytest.skip("a GPU machine can run FlashAttention")
    cfg = compose_train(tmp_path, "+method=sft", "model=tiny-qwen2", f"model.attn_implementation={attn}",
                        "data.max_samples=2", "method.max_steps=1")  # fmt: skip
    with pytest.raises(SettingsError, match=refusal):
        recipe.run(cfg)
    assert not (tmp_path / "run").exists()
