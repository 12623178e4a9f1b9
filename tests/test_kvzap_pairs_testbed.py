"""KVzap pairs from recall-testbed traces (``+pipeline=kvzap_pairs_testbed``, data_prep/kvzap_pairs_testbed.py)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from hydra import compose, initialize_config_dir
from safetensors import safe_open

from data_prep import kvzap_pairs_testbed as tb
from data_prep import testbed
from data_prep import testbed_tokenizer as tt
from zoomr.entry import CONF_DIR
from zoomr.schemas import register_with_hydra
from zoomr.schemas.kvzap import TestbedPairsSource
from zoomr.schemas.testbed import TestbedData

SHORT = {"query_form": "cue", "trace_tokens": 160}


@pytest.fixture(scope="module")
def tokenizer():
    return tt.build_tokenizer()


def source(**kw) -> TestbedPairsSource:
    return TestbedPairsSource(**{"n_train": 3, "n_val": 2, "data": dict(SHORT), **kw})


def test_settings_are_checked_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="test seeds"):
        TestbedPairsSource(seed=2_000_003)
    with pytest.raises(ValueError, match="recall\\|copy"):
        TestbedPairsSource(pretext="repeat")
    with pytest.raises(ValueError, match="unknown TestbedData fields \\['query_style'\\]"):
        tb.testbed_data(source(data={"query_style": "cue"}))
    # a model directory fixes the trace format and the seeds it was trained and tested on
    (tmp_path / "testbed_data.json").write_text(json.dumps({**TestbedData().__dict__, "query_form": "inline"}))
    with pytest.raises(ValueError, match="query_form: model 'inline', pairs 'cue'"):
        tb.testbed_data(source(), str(tmp_path))
    (tmp_path / "testbed_data.json").write_text(json.dumps({**TestbedData().__dict__, "query_form": "cue", "seed": 7}))
    with pytest.raises(ValueError, match="trained or tested on"):
        tb.testbed_data(source(seed=7), str(tmp_path))
    assert tb.testbed_data(source(seed=8), str(tmp_path)).seed == 8


def test_documents_are_the_served_traces_of_a_disjoint_stream(tokenizer):
    src = source()
    data = tb.testbed_data(src)
    pieces = tb.testbed_pieces(src, data, tokenizer)
    assert [p[0] for p in pieces] == ["val", "val", "train", "train", "train"]
    assert len({p[1] for p in pieces}) == 5  # one problem each
    enc = tt.FastEncoder(tokenizer)
    test = [testbed.problem(data, data.test_seed, i).response_words for i in range(20)]
    for i, (_, origin, ids) in enumerate(pieces):
        p = testbed.problem(data, src.seed, i)
        served, _ = enc.chat(p.prompt_words, p.response_words)
        assert origin == f"testbed/{src.seed}/{i}" and ids == served[:-2]  # recall: without "} <|im_end|>"
        assert tokenizer.convert_ids_to_tokens(served[-2:]) == ["}", "<|im_end|>"]
        assert p.response_words not in test
    copy = tb.testbed_pieces(source(pretext="copy"), data, tokenizer)
    assert [c[2][: len(p[2])] for c, p in zip(copy, pieces)] == [p[2] for p in pieces]
    assert all(len(c[2]) == len(p[2]) + 2 for c, p in zip(copy, pieces))


def test_recall_pretext_queries_every_defined_fact_once(tokenizer):
    src = source()
    data = tb.testbed_data(src)
    pieces = tb.testbed_pieces(src, data, tokenizer)
    for i, (_, _, ctx) in enumerate(pieces):
        pre = tb.build_testbed_pretext(src, data, tokenizer, i)
        p = testbed.problem(data, src.seed, i)
        assert pre.context == (0, len(ctx)) and pre.input_ids[0, : len(ctx)].tolist() == ctx
        words = tokenizer.convert_ids_to_tokens(pre.input_ids[0, pre.repeat[0] : pre.repeat[1]].tolist())
        assert pre.repeat[1] == pre.input_ids.shape[1] and len(words) == 5 * len(p.facts)
        asked = {words[j + 1]: words[j + 4] for j in range(0, len(words), 5)}
        assert [words[j] + words[j + 2] + words[j + 3] for j in range(0, len(words), 5)] == ["?:="] * len(p.facts)
        assert asked == {tt.key(f.key): tt.value(f.value) for f in p.facts}
        assert list(asked) != [tt.key(f.key) for f in p.facts]  # shuffled, not definition order
        assert tb.build_testbed_pretext(src, data, tokenizer, i).input_ids.equal(pre.input_ids)  # deterministic
    copy = tb.build_testbed_pretext(source(pretext="copy"), data, tokenizer, 0)
    n = copy.n_context
    assert copy.repeat == (n, 2 * n) and copy.input_ids[0, :n].equal(copy.input_ids[0, n:])


def test_pipeline_writes_the_models_own_hidden_states(tmp_path):
    """Through the Hydra config: the stored h are the attention inputs of the served trace (causal: the
    pretext's tail changes nothing before it), the targets finite, the splits as planned."""
    from data_prep.kvzap_pairs import run
    from zoomr.entry import model_spec
    from zoomr.models import load_model

    register_with_hydra()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose("data_prep", [
            "+pipeline=kvzap_pairs_testbed", "model=tiny-testbed", f"cache_dir={tmp_path}/cache",
            "logger.mode=disabled", f"run_dir={tmp_path}/dp", f"pipeline.out_dir={tmp_path}/pairs",
            "pipeline.testbed.n_train=3", "pipeline.testbed.n_val=2", "pipeline.testbed.data.trace_tokens=160",
            "pipeline.tokens_per_doc=40", "pipeline.docs_per_shard=2",
        ])  # fmt: skip
    summary = run(cfg)
    assert (summary["pairs_train"], summary["pairs_val"]) == (120, 80)
    manifest = json.loads((tmp_path / "pairs" / "manifest.json").read_text())
    assert Counter(d["split"] for d in manifest["documents"]) == {"train": 3, "val": 2}
    assert manifest["settings"]["testbed"]["source"]["seed"] == 2
    spec = model_spec(cfg)
    model = load_model(spec, f"{tmp_path}/cache")
    tokenizer = tt.build_tokenizer()
    src = TestbedPairsSource(**{**manifest["settings"]["testbed"]["source"]})
    data = tb.testbed_data(src)
    captured = {}
    hooks = [layer.self_attn.register_forward_pre_hook(
        lambda m, a, k, i=i: captured.__setitem__(i, k["hidden_states"][0]), with_kwargs=True)
        for i, layer in enumerate(model.model.layers)]  # fmt: skip
    shard = manifest["shards"][0]
    with safe_open(str(tmp_path / "pairs" / shard["file"]), framework="pt") as f:
        doc, pos = f.get_tensor("doc"), f.get_tensor("pos")
        first = doc == shard["docs"][0]
        ids = tb.testbed_pieces(src, data, tokenizer)[shard["docs"][0]][2]
        with torch.no_grad():
            model(torch.tensor([ids]))
        for layer in range(model.config.num_hidden_layers):
            h, y = f.get_tensor(f"h.{layer}")[first].float(), f.get_tensor(f"y.{layer}")
            torch.testing.assert_close(h, captured[layer][pos[first]].float(), atol=2e-2, rtol=2e-2)  # bf16 store
            assert torch.isfinite(y).all() and y.shape[1] == model.config.num_key_value_heads
    for h in hooks:
        h.remove()
