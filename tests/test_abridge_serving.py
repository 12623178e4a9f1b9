"""AbridgeKV serving policy: parity with the trainer, controls, physical per-layer freeing, batching."""

from __future__ import annotations

import pytest
import torch

from zoomr.abridge.artifacts import save_abridge_config
from zoomr.abridge.layout import AbridgeLayout, interleave, roles_from_order
from zoomr.abridge.parity import parity_report
from zoomr.cache import build_policy
from zoomr.cache.abridge import AbridgeCache, AbridgeMethod
from zoomr.engine import DecodeSettings, generate

QUOTAS = [2, 4, 1, 3]
PROMPT = "Every morning Aya goes for a walk"


@pytest.fixture(scope="module")
def model_tok(tiny_model_and_tokenizer):
    return tiny_model_and_tokenizer


@pytest.mark.parametrize("mode", ["spread", "appended"])
def test_trainer_and_incremental_generator_agree(model_tok, mode):
    model, tok = model_tok
    layout = AbridgeLayout(16, 4, mode)
    prompt = tok(PROMPT, add_special_tokens=False).input_ids
    wrong = [3, 4, 1, 3]  # layer 0 keeps one code row too many
    r = parity_report(model, tok, prompt, layout, QUOTAS, wrong, max_new_tokens=70)
    assert r["tokens"] == 70 and r["pause_tokens_run"] == 4 * 4  # blocks 0-3 compressed, block 4 open
    assert r["max_abs_ce_diff"] < 1e-4, r  # fp32: ~3e-6 measured (paper bar: 4.5e-4)
    assert r["wrong_over_parity"] >= 100, r
    # negative control: full attention over the uncompressed history is a different function, and
    # wherever it disagrees with the masked forward, the served model sides with the masked forward
    assert r["disagreeing_tokens"] > 0
    assert r["served_follows_compressing"] == r["disagreeing_tokens"], r


def test_rows_are_freed_per_layer_to_each_quota(model_tok):
    model, tok = model_tok
    layout = AbridgeLayout(16, 4)
    prompt = tok(PROMPT, add_special_tokens=False).input_ids
    cache = AbridgeCache(AbridgeMethod(page_size=1), model.config, tok, layout=layout, quotas=QUOTAS)
    settings = DecodeSettings(max_new_tokens=53, stop_token_ids=[], progress=False)
    out = generate(model, tok, [prompt], cache, settings)[0]
    # after the last forward: prompt + 3 compressed blocks x q_l + 4 raw rows of the open block
    # (the 53rd token was sampled, never fed)
    expected = [len(prompt) + 3 * q + 4 for q in QUOTAS]
    assert out.stats.rows[-1].tolist() == [[e, e] for e in expected]
    # each layer holds pages for its own rows only (page_size 1: exactly), no padding to the largest quota
    row_bytes = 2 * cache.kv_heads * cache.head_dim * 4  # K and V, fp32
    assert [int(layer.store.seq_kv_bytes()[0]) for layer in cache.layers] == [e * row_bytes for e in expected]
    full = generate(model, tok, [prompt], {"policy": "full"}, settings)[0]
    assert full.token_ids != out.token_ids or full.stats.kv_bytes[-1] > out.stats.kv_bytes[-1]
    assert full.stats.rows[-1].min() == len(prompt) + 52


def test_batched_generation_matches_one_by_one(model_tok):
    model, tok = model_tok
    layout = AbridgeLayout(8, 4)
    prompts = [
        tok(p, add_special_tokens=False).input_ids for p in (PROMPT, "Find the sum", "A list of x y z w")
    ]
    settings = DecodeSettings(max_new_tokens=30, stop_token_ids=[], progress=False)

    def run(ps):
        cache = AbridgeCache(AbridgeMethod(), model.config, tok, layout=layout, quotas=QUOTAS)
        return generate(model, tok, ps, cache, settings)

    together = run(prompts)
    for p, out in zip(prompts, together):
        alone = run([p])[0]
        assert alone.token_ids == out.token_ids
        assert (alone.stats.rows[-1] == out.stats.rows[-1]).all()


def test_layout_fields_given_on_the_command_line_that_the_checkpoint_replaces_are_refused(model_tok, tmp_path):
    """``python -m eval +method=abridge method.quota=2 model.hf_id=<checkpoint>`` served the checkpoint's quotas
    (abridge.json wins, ``layout_from_checkpoint``) while the run's config.json said quota 2: a field the user set is
    now refused when the checkpoint serves another value, before anything is written."""
    from eval.__main__ import check_policy

    model, tok = model_tok
    save_abridge_config(tmp_path, AbridgeLayout(32, 8, "tail"), [4, 4, 8, 0])
    config = model.config.__class__.from_dict(model.config.to_dict())
    config._name_or_path = str(tmp_path)
    model = type("Loaded", (), {"config": config})()  # check_policy reads only the model's config
    asked = AbridgeMethod(quota=2, block_size=32)
    assert build_policy(asked, config, tok).ignored_settings({"quota", "block_size"}) == [
        "method.quota=2 (the checkpoint serves quotas [4, 4, 8, 0])"]  # C = 32 is what it serves
    assert build_policy(asked, config, tok).ignored_settings(set()) == []  # defaults the user did not set
    assert build_policy(AbridgeMethod(num_pause=16), config, tok).ignored_settings({"num_pause"}) == [
        "method.num_pause=16 (the checkpoint serves 8)"]
    assert build_policy(AbridgeMethod(quota=9), config, tok).ignored_settings({"quota"}) == [
        "method.quota=9 (the checkpoint serves quotas [4, 4, 8, 0])"]  # above its K = 8: no quotas at all
    with pytest.raises(SystemExit, match=r"method.quota=2 \(the checkpoint serves quotas \[4, 4, 8, 0\]\)\n.*"
                                         r"method.layout_from_checkpoint=false"):
        check_policy(asked, model, tok, {"quota", "block_size"})
    assert check_policy(asked, model, tok, set()) is asked
    served = AbridgeMethod(quota=2, block_size=32, layout_from_checkpoint=False)  # the config's layout, as asked
    assert check_policy(served, model, tok, {"quota", "block_size", "layout_from_checkpoint"}) is served


def test_serving_roles_equal_the_training_layout():
    for mode in ("spread", "appended"):
        layout = AbridgeLayout(8, 4, mode)
        s = interleave([1, 2, 3, 4, 5], list(range(100, 131)), layout, [900, 901, 902, 903])
        order = torch.arange(len(s))[None]
        kind, block, slot = roles_from_order(order, torch.tensor([5]), layout)
        assert kind[0].tolist() == s.kind and block[0].tolist() == s.block and slot[0].tolist() == s.slot


def test_policy_builds_from_the_method_config_and_reads_checkpoints(model_tok, tmp_path, caplog):
    model, tok = model_tok
    with pytest.raises(ValueError, match="has no abridge.json.*method.allow_untrained=true"):
        build_policy({"name": "abridge"}, model.config, tok)  # an untrained model: refused
    cache = build_policy({"name": "abridge", "allow_untrained": True}, model.config, tok)
    assert isinstance(cache, AbridgeCache) and cache.quotas == [8] * 4 and cache.layout.block_size == 64
    save_abridge_config(tmp_path, AbridgeLayout(32, 8, "tail"), [4, 4, 8, 0])
    config = model.config.__class__.from_dict(model.config.to_dict())
    config._name_or_path = str(tmp_path)
    with caplog.at_level("INFO", logger="zoomr.cache.abridge"):
        cache = build_policy({"name": "abridge"}, config, tok)
        build_policy({"name": "abridge"}, config, tok)  # the evaluator builds one per batch: said once, not each time
    assert cache.quotas == [4, 4, 8, 0] and cache.layout == AbridgeLayout(32, 8, "tail")
    said = [r.getMessage() for r in caplog.records if "from the checkpoint" in r.getMessage()]
    assert said == ["abridge: layout AbridgeLayout(block_size=32, num_pause=8, code_positions='tail') and quotas "
                    "[4, 4, 8, 0] from the checkpoint"]  # fmt: skip
    with pytest.raises(ValueError, match="tokenizer"):
        build_policy({"name": "abridge"}, config, None)
