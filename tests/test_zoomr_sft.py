"""``python -m train +method=zoomr_sft`` on summary-augmented traces: LoRA + exactly the delimiter rows train."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from data_prep.fake_llm_server import FakeServer
from data_prep.summarize import summarize_traces
from tests.test_summarize import settings, small_rows
from zoomr import tokens


@pytest.fixture(scope="module")
def summarized(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("summaries")
    with FakeServer() as server:
        summarize_traces(small_rows(), settings(server.base_url, min_chars=300), out)
    return out / "summarized.jsonl"


def train(run_dir: Path, data: Path, *overrides: str) -> dict:
    cmd = [
        sys.executable, "-m", "train", "+method=zoomr_sft", "data=zoomr_summaries", f"data.path={data}",
        "method.max_length=384", "method.per_device_batch_size=2", "method.gradient_accumulation_steps=1",
        "method.logging_steps=1", "method.learning_rate=2e-2", "method.warmup_ratio=0.0",
        *overrides, f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SFT finished" in proc.stdout
    return json.loads((run_dir / "summary.json").read_text())


def merged_weights(base_dir: str, adapter_dir: str):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir)
    before = (base.get_input_embeddings().weight.clone(), base.get_output_embeddings().weight.clone())
    merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    return before, (merged.get_input_embeddings().weight, merged.get_output_embeddings().weight)


def changed_rows(a: torch.Tensor, b: torch.Tensor) -> set[int]:
    return set(torch.nonzero((a != b).any(dim=1)).flatten().tolist())


@pytest.mark.parametrize(
    "tied", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["tied", "untied+resume"]
)
def test_exactly_the_delimiter_rows_train(tmp_path, summarized, tied, cache_dir):
    from tests.conftest import tiny_spec
    from zoomr.models import build_tiny

    extra = [] if tied else ["+model.tiny.tie_word_embeddings=false"]
    summary = train(tmp_path / "run", summarized, "method.max_steps=2", "method.save_steps=2", *extra)
    ids = [summary["trainable_tokens"][t] for t in tokens.SUMMARY_TAGS]
    assert summary["trainable_rows"] == ({"embed_tokens": 2} if tied else {"embed_tokens": 2, "lm_head": 2})
    assert summary["steps"] == 2 and summary["mode"].startswith("LoRA")
    spec = tiny_spec("qwen2", **({} if tied else {"tie_word_embeddings": False}))
    (emb0, head0), (emb1, head1) = merged_weights(str(build_tiny(spec, cache_dir)), summary["checkpoint"])
    assert changed_rows(emb0, emb1) == set(ids)
    assert changed_rows(head0, head1) == set(ids)
    if not tied:  # resume continues from the checkpoint with the trainable rows restored
        again = train(tmp_path / "run", summarized, "method.max_steps=3", "method.save_steps=2", *extra)
        assert again["resumed_from"].endswith("checkpoint-2") and again["steps"] == 3


def test_refuses_data_without_summaries():
    from hydra import compose, initialize_config_dir

    from train import zoomr_sft
    from zoomr.entry import CONF_DIR
    from zoomr.schemas import register_with_hydra

    register_with_hydra()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=["+method=zoomr_sft", "data=traces", "data.max_samples=3"])
    with pytest.raises(SystemExit, match="has no <\\|begin_of_summary\\|>"):
        zoomr_sft.run(cfg)


class Split(Exception):
    """Raised where the SFT splits the rows it trains on (``zoomr.sft.held_out_split``): after the model and its
    adapter are prepared, before any run state is written. ``args[0]``: those rows."""


def _run_until_split(data_path, cache_dir, monkeypatch) -> list:
    """``python -m train +method=zoomr_sft data=zoomr_summaries data.path=<data_path>`` run in-process up to the point
    it splits its rows; the rows it would train on."""
    from hydra import compose, initialize_config_dir

    import zoomr.sft
    from train import zoomr_sft
    from zoomr.entry import CONF_DIR
    from zoomr.schemas import register_with_hydra

    def split(rows, *args):
        raise Split(rows)

    monkeypatch.setattr(zoomr.sft, "held_out_split", split)
    register_with_hydra()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("train", overrides=["+method=zoomr_sft", "data=zoomr_summaries", f"data.path={data_path}",
                                          f"cache_dir={cache_dir}", "logger=none", "run_dir=unused"])  # fmt: skip
    with pytest.raises(Split) as stopped:
        zoomr_sft.run(cfg)
    return stopped.value.args[0]


def test_rows_with_malformed_summary_markup_are_not_trained_on(tmp_path, cache_dir, monkeypatch):
    """Rows whose summary markup is unclosed, nested or unpaired (a hand-edited or foreign summarized.jsonl) trained the
    model to write it so, without a word; the trace loader now skips and counts them (``unpaired_summary_tags``), so
    the SFT trains on the well-formed rows only."""
    B, E, T0, T1 = tokens.BEGIN_SUMMARY, tokens.END_SUMMARY, tokens.BEGIN_THOUGHT, tokens.END_THOUGHT
    bodies = {"good": f"a\n\n{B}s{E}\n\nb\n\n{B}t{E}", "open": f"a\n\n{B}s{E}\n\nb\n\n{B}t", "nested": f"a{B}s{B}t{E}",
              "stray": f"a{E}\n\nb\n\n{B}s{E}"}  # fmt: skip
    path = tmp_path / "summarized.jsonl"
    path.write_text("".join(json.dumps({"id": k, "conversations": [{"from": "user", "value": "q?"},
                    {"from": "assistant", "value": f"{T0}{v}{T1}"}]}) + "\n" for k, v in bodies.items()))  # fmt: skip
    trained = _run_until_split(path, cache_dir, monkeypatch)
    assert len(trained) == 1 and B in trained[0]["messages"][-1]["content"]  # the well-formed row alone


def test_the_data_is_read_once_and_checked_before_the_model_loads(summarized, cache_dir, monkeypatch):
    """The summary check read the data config's rows, then the SFT read them all again: once now, the rows the
    check passed are the rows trained on. The check still comes before the model loads."""
    import data_prep.traces
    import zoomr.sft

    events, read, load = [], data_prep.traces.sft_dataset, zoomr.sft.load_model
    monkeypatch.setattr(data_prep.traces, "sft_dataset", lambda *a: events.append(("data", read(*a))) or events[-1][1])
    monkeypatch.setattr(zoomr.sft, "load_model", lambda *a, **kw: events.append(("model", None)) or load(*a, **kw))
    trained = _run_until_split(summarized, cache_dir, monkeypatch)
    assert [e for e, _ in events] == ["data", "model"] and trained is events[0][1]


def test_two_runs_of_one_command_start_from_the_same_delimiter_rows_and_lora(summarized, cache_dir, monkeypatch):
    """The delimiter rows (drawn from the embeddings' mean and covariance) and LoRA's initial weights were drawn
    before the trainer seeded the process: two runs of one command with one ``seed`` trained two models (the SFT
    without new tokens, whose PEFT model the trainer makes, reproduces itself). Now the draws come from ``seed``."""
    from train import zoomr_sft

    def prepare(*args):
        model, peft_config, extra = real(*args)
        starts.append({k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad})
        return model, peft_config, extra

    starts, real = [], zoomr_sft.prepare
    monkeypatch.setattr(zoomr_sft, "prepare", prepare)
    for _ in range(2):
        _run_until_split(summarized, cache_dir, monkeypatch)
    assert starts[0].keys() == starts[1].keys() and any("lora_A" in k for k in starts[0])
    assert all(torch.equal(starts[0][k], starts[1][k]) for k in starts[0])
