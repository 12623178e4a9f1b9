"""AbridgeKV on the recall testbed: loss only on what the model writes, lazily generated streams, the
full-KV reference on the same targets (MINIATURE_NOTES: the trainer's testbed defects)."""

from __future__ import annotations

import torch

from zoomr.abridge.forward import full_kv_response_ce, heldout_full_kv_ce
from zoomr.abridge.layout import IGNORE, RAW, AbridgeLayout
from zoomr.abridge.trainer import load_streams
from zoomr.schemas.testbed import TestbedData
from zoomr.testbed import task as tb
from zoomr.testbed import vocab as tt

DATA = {**vars(TestbedData(trace_tokens=256, n_train=12, query_form="cue"))}


def test_streams_label_only_model_written_tokens_and_match_the_problems():
    tok = tt.build_tokenizer()
    layout = AbridgeLayout(64, 16)
    streams = load_streams(DATA, tok, layout, 64, 300, heldout=2)
    assert len(streams.streams) == 12
    cfg = TestbedData(**DATA)
    for i in (0, 5, 11):
        s = streams.streams[i]
        p = tb.problem(cfg, cfg.seed, i)
        ids, start = tt.FastEncoder(tok).chat(p.prompt_words, p.response_words)
        raw = [t for t, k in zip(s.input_ids, s.kind) if k == RAW]
        assert raw == ids[start:]  # the response, pauses aside
        assert [t for t in s.labels if t != IGNORE] == [ids[start + j] for j in p.model_writes]
    held, train = streams.streams[:2], streams.streams[2:]
    assert len(held) == 2 and len(train) == 10 and train[0].input_ids == streams.streams[2].input_ids


def test_full_kv_reference_scores_the_same_targets(tmp_path):
    """The held-out full-KV CE counts exactly the labelled tokens (it once scored all ~1,000 per trace)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = tt.build_tokenizer()
    s = load_streams(DATA, tok, AbridgeLayout(64, 16), 64, 300, heldout=2).streams[0]
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    from zoomr.abridge.data import collate

    (ce,) = full_kv_response_ce(model.eval(), collate([s], 0))
    assert ce.numel() == sum(t != IGNORE for t in s.labels)
    assert abs(heldout_full_kv_ce(model, [s], 0) - float(ce.mean())) < 1e-6


def test_full_kv_reference_of_a_second_stage_is_the_uncompressed_start(tmp_path):
    """A second AbridgeKV stage starts from an AbridgeKV model, whose weights no longer work uncompressed:
    the closing table's full-KV arm follows ``method.init_from`` up to the first plain checkpoint."""
    import json

    from train.abridge import uncompressed_start

    base = tmp_path / "base" / "final"
    stage1 = tmp_path / "stage1" / "final"
    stage2 = tmp_path / "stage2" / "final"
    for d in (base, stage1, stage2):
        d.mkdir(parents=True)
    for run, start in ((stage1, base), (stage2, stage1)):
        (run / "abridge.json").write_text("{}")
        (run.parent / "config.json").write_text(json.dumps({"method": {"init_from": str(start)}}))
    assert uncompressed_start(stage2) == base and uncompressed_start(stage1) == base
    assert uncompressed_start(base) == base  # a plain model is its own reference
