"""KVzap pruning policy (KVzap paper §3.3, Algorithm 1): exact kept sets, full-KV equivalence, ragged memory."""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AttentionInterface

from tests.conftest import tiny_spec
from zoomr.cache import build_policy
from zoomr.cache.kvzap import KVzapCache, KVzapMethod, compression_of
from zoomr.engine import DecodeSettings, generate
from zoomr.kvzap.surrogate import new_surrogate
from zoomr.models import load_model_and_tokenizer


@pytest.fixture(scope="module")
def tiny(cache_dir):
    model, tok = load_model_and_tokenizer(
        tiny_spec("qwen2", num_hidden_layers=2), cache_dir, attn_implementation="zoomr"
    )
    torch.manual_seed(0)
    surrogate = new_surrogate(model.config.hidden_size, model.config.num_key_value_heads, 2, None)
    return model, tok, surrogate.eval()


def kvzap(model, surrogate, threshold, window=16, decoding=True):
    cfg = KVzapMethod(threshold=threshold, window=window, decoding=decoding)
    return KVzapCache(cfg, model.config, surrogate=surrogate)


def attention_inputs(model, ids, attn_impl=None):
    """Independent path: every layer's attention input from output_hidden_states + input_layernorm."""
    if attn_impl:
        model.set_attn_implementation(attn_impl)
    try:
        with torch.no_grad():
            out = model(ids, output_hidden_states=True)
    finally:
        model.set_attn_implementation("zoomr")
    return [layer.input_layernorm(out.hidden_states[i]) for i, layer in enumerate(model.model.layers)], out


def scores_of(surrogate, hidden):
    with torch.no_grad():
        return [surrogate.score(i, h[0]) for i, h in enumerate(hidden)]  # [T, H_kv] per layer


def run_teacher_forced(model, cache, ids, n_prefill):
    """Prefill, then one token at a time; record per step and layer the positions seen and those kept."""
    seen, kept = [], []
    original = cache.after_attention

    def wrapped(layer):
        if layer.idx == 0:
            seen.append({})
            kept.append({})
        seen[-1][layer.idx] = layer.view.pos.where(layer.view.valid, torch.tensor(-1)).clone()
        original(layer)
        rows = layer.store.rows()
        kept[-1][layer.idx] = rows.pos.where(rows.valid, torch.tensor(-1)).clone()

    cache.after_attention = wrapped
    handles = cache.attach(model)
    try:
        with torch.no_grad():
            out = [model(ids[:, :n_prefill], cache=cache, use_cache=True).logits[:, -1:]]
            for t in range(n_prefill, ids.shape[1] - 1):
                pos = torch.tensor([[t]])
                out.append(model(ids[:, t : t + 1], cache=cache, use_cache=True, position_ids=pos).logits)
    finally:
        for h in handles:
            h.remove()
    return torch.cat(out, 1), seen, kept


def test_prefill_evicts_exactly_low_scores_outside_the_window(tiny):
    model, _, surrogate = tiny
    T, w = 80, 16
    ids = torch.randint(0, 4000, (1, T), generator=torch.Generator().manual_seed(0))
    scores = scores_of(surrogate, attention_inputs(model, ids, "sdpa")[0])
    tau = float(torch.cat(scores).median())
    previous = None
    for t in (-math.inf, tau - 0.3, tau, tau + 0.3, math.inf):
        cache = kvzap(model, surrogate, t, window=w)
        _, _, kept = run_teacher_forced(model, cache, ids, T)
        sets = []
        for layer in range(2):
            for h in range(2):
                got = [p for p in kept[0][layer][0, h].tolist() if p >= 0]
                want = [i for i in range(T) if i >= T - w or scores[layer][i, h] >= t]
                assert got == want, (t, layer, h)
                sets.append(set(got))
        if previous is not None:  # a higher threshold keeps a subset
            assert all(a <= b for a, b in zip(sets, previous))
        previous = sets
    assert all(len(s) == w for s in sets)  # threshold +inf: the window alone


def test_decode_kept_sets_follow_the_rule_and_logits_match_explicit_mask(tiny):
    """Replay: an explicit-mask forward with the visibility the cache produced gives the same logits, its
    hidden states give the scores, and the rule applied to those scores gives exactly the kept rows."""
    model, _, surrogate = tiny
    n_prefill, T, w = 40, 90, 12
    ids = torch.randint(0, 4000, (1, T), generator=torch.Generator().manual_seed(1))
    tau = float(torch.cat(scores_of(surrogate, attention_inputs(model, ids, "sdpa")[0])).quantile(0.6))
    cache = kvzap(model, surrogate, tau, window=w)
    got, seen, kept = run_teacher_forced(model, cache, ids, n_prefill)
    Hq, Hkv = model.config.num_attention_heads, model.config.num_key_value_heads
    masks = []
    for layer in range(2):
        m = torch.tril(torch.ones(T, T, dtype=torch.bool)).repeat(Hq, 1, 1)
        for step, t in enumerate(range(n_prefill, T - 1)):
            pos = seen[step + 1][layer][0]
            m[:, t] = False
            for h in range(Hq):
                p = pos[h // (Hq // Hkv)]
                m[h, t, p[p >= 0]] = True
        masks.append(m[None])

    def attn(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        g = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(g, 1), value.repeat_interleave(g, 1)
        o = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=masks[module.layer_idx], scale=scaling
        )
        return o.transpose(1, 2).contiguous(), None

    AttentionInterface.register("kvzap_explicit_mask_test", attn)
    hidden, out = attention_inputs(model, ids, "kvzap_explicit_mask_test")
    assert (got - out.logits[:, n_prefill - 1 : T - 1]).abs().max() <= 1e-5
    scores = scores_of(surrogate, hidden)
    evicted_some = False
    for step in range(len(kept)):
        fed = n_prefill + step
        for layer in range(2):
            for h in range(Hkv):
                got_rows = [p for p in kept[step][layer][0, h].tolist() if p >= 0]
                want = [i for i in range(fed) if fed - 1 - i < w or scores[layer][i, h] >= tau]
                assert got_rows == want, (step, layer, h)
                evicted_some |= len(want) < fed
    assert evicted_some


def test_minus_infinity_is_full_kv(tiny):
    model, tok, surrogate = tiny
    ids = torch.randint(0, 4000, (1, 120), generator=torch.Generator().manual_seed(2))
    got, _, _ = run_teacher_forced(model, kvzap(model, surrogate, -math.inf), ids, 50)
    full, _, _ = run_teacher_forced(model, build_policy({"policy": "full"}, model.config), ids, 50)
    assert torch.equal(got, full)
    with torch.no_grad():
        ref = model(ids[:, :-1]).logits[:, 49:]
    assert (got - ref).abs().max() <= 1e-5
    s = DecodeSettings(max_new_tokens=20, progress=False, stop_token_ids=[])
    a = generate(model, tok, ["Tell me a story"], kvzap(model, surrogate, -math.inf), s)[0]
    b = generate(model, tok, ["Tell me a story"], {"policy": "full"}, s)[0]
    assert a.token_ids == b.token_ids and compression_of(a, 2)["compression"] == 0.0


def test_higher_threshold_removes_more_ragged_rows_and_bytes(tiny):
    model, tok, surrogate = tiny
    prompt = " ".join(["the cat sat on the mat and looked at the dog"] * 8)
    s = DecodeSettings(max_new_tokens=40, progress=False, stop_token_ids=[])
    ids = tok(prompt, add_special_tokens=False).input_ids
    scores = torch.cat(scores_of(surrogate, attention_inputs(model, torch.tensor([ids]), "sdpa")[0]))
    taus = [-math.inf, *(float(scores.quantile(q)) for q in (0.2, 0.5, 0.8)), math.inf]
    results = []
    for tau in taus:
        cache = kvzap(model, surrogate, tau, window=16)
        out = generate(model, tok, [ids], cache, s)[0]
        results.append((compression_of(out, 2), out, cache))
    comp = [r[0]["compression"] for r in results]
    assert comp[0] == 0.0 and all(a < b for a, b in zip(comp, comp[1:])), comp
    assert results[-1][1].stats.rows[-1].max() == 16  # +inf: the window alone
    mid = results[2][1].stats
    assert (mid.rows[-1][:, 0] != mid.rows[-1][:, 1]).any()  # KV heads keep different numbers of rows
    kv = [r[1].stats.kv_bytes[-1] for r in results]
    assert all(a > b for a, b in zip(kv, kv[1:]))  # pages really freed
    rows = [r[1].stats.rows[-1].sum() for r in results]
    page_bytes = 2 * 16 * 64 * 4  # k+v, page_size 16, head_dim 64, fp32
    for r, b in zip(rows, kv):  # bytes follow the rows up to one partly filled page per (layer, head)
        assert r * page_bytes / 16 <= b < (r / 16 + 2 * 2) * page_bytes
    per_layer = results[2][0]["per_layer"]
    assert len(per_layer) == 2 and 0 < results[2][0]["prefill_compression"] < 1


def test_left_padded_batch_equals_single_runs(tiny):
    model, tok, surrogate = tiny
    prompts = ["The quick brown fox jumps over the lazy dog " * 3, "Hello", "A long prompt " * 6]
    s = DecodeSettings(max_new_tokens=25, progress=False, stop_token_ids=[])
    batch = generate(model, tok, prompts, kvzap(model, surrogate, 0.0, window=8), s)
    for p, out in zip(prompts, batch):
        single = generate(model, tok, [p], kvzap(model, surrogate, 0.0, window=8), s)[0]
        assert out.token_ids == single.token_ids
        assert (out.stats.rows[-1] == single.stats.rows[-1]).all()


def test_prefill_only_and_loading_from_config(tiny, tmp_path):
    model, tok, surrogate = tiny
    surrogate.save_pretrained(tmp_path / "linear")
    cfg = {"policy": "kvzap", "surrogate_dir": str(tmp_path), "model_type": "linear", "threshold": 0.0,
           "window": 8, "decoding": False}  # fmt: skip
    cache = build_policy(cfg, model.config)
    assert isinstance(cache, KVzapCache) and torch.equal(
        cache.surrogate.layers[1].weight, surrogate.layers[1].weight
    )
    out = generate(model, tok, ["one two three four five six seven eight nine ten " * 3], cache,
                   DecodeSettings(max_new_tokens=30, progress=False, stop_token_ids=[]))[0]  # fmt: skip
    rows = out.stats.rows
    assert (rows[1:] - rows[:-1] == 1).all()  # after prefill nothing is evicted any more
    assert rows[0].max() < out.prompt_tokens
    with pytest.raises(FileNotFoundError, match="no KVzap checkpoint"):
        build_policy({**cfg, "model_type": "mlp"}, model.config)
    with pytest.raises(ValueError, match="does not match"):
        KVzapCache(KVzapMethod(), model.config, surrogate=new_surrogate(256, 2, 3))
    with pytest.raises(RuntimeError, match="attention inputs"), torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), cache=kvzap(model, surrogate, 0.0), use_cache=True)


@pytest.mark.parametrize("mode", ["ratio", "threshold"])
def test_kvzip_oracle_prunes_the_prompt_by_its_scores(tiny, mode):
    from zoomr.kvzap.pretext import build_repeat_pretext
    from zoomr.kvzap.scoring import kvzip_scores

    model, tok, _ = tiny
    prompt = tok("The capital of France is Paris. The capital of Spain is Madrid. " * 3).input_ids
    log_s = kvzip_scores(model, build_repeat_pretext(tok, prompt)).log()  # [L, H, n]
    L, H, n = log_s.shape
    own = {"ratio": 0.5, "n_sink": 2} if mode == "ratio" else {"window": 8, "threshold": float(log_s.median())}
    cfg = {"policy": "kvzip", "mode": mode, **own}
    cache = build_policy(cfg, model.config, tok)
    out = generate(
        model, tok, [prompt], cache, DecodeSettings(max_new_tokens=5, progress=False, stop_token_ids=[])
    )
    torch.testing.assert_close(cache.log_scores[0], log_s)
    kept = [cache.layers[i].store.rows().pos[0] for i in range(L)]  # per layer [H, N]
    rows = out[0].stats.rows
    assert (rows[1:] - rows[:-1] == 1).all()  # pruned once, after prefill
    if mode == "ratio":
        assert int(rows[0].sum()) == L * H * n - int(L * H * n * 0.5)
        s = log_s.clone()
        s[..., :2] = math.inf
        cut = s.flatten().sort().values[int(L * H * n * 0.5)]
        for la in range(L):
            for h in range(H):
                got = set(kept[la][h][kept[la][h] >= 0].tolist()) & set(range(n))
                assert all(s[la, h, i] >= cut for i in got) and {0, 1} <= got
        assert len({int(r) for r in rows[0].sum(-1)}) > 1  # layers differ (global ranking)
    else:
        for la in range(L):
            for h in range(H):
                got = [p for p in kept[la][h].tolist() if 0 <= p < n]
                assert got == [i for i in range(n) if log_s[la, h, i] >= cfg["threshold"] or i >= n - 8]


def test_compression_sweep_script_runs_on_the_evaluators_prompts(tmp_path, monkeypatch, cache_dir, capsys):
    """``python -m analysis.kvzap_compression`` (README, KVzap section) failed at import since the evaluator's
    prompts moved to tasks; it now prompts as ``eval`` does and writes its JSON under the working directory.
    τ = -inf keeps everything (full KV's tokens, nothing removed); a higher τ removes more."""
    from analysis import kvzap_compression
    from eval.benchmarks import load_problems
    from eval.math_tasks import MATH
    from zoomr.configs import model_config

    model, tok = load_model_and_tokenizer(model_config("tiny-qwen2"), cache_dir)
    torch.manual_seed(0)
    config = model.config
    new_surrogate(config.hidden_size, config.num_key_value_heads, config.num_hidden_layers).save_pretrained(tmp_path / "mlp")
    prompts = kvzap_compression.math500_prompts(tok, 2)
    assert tok.decode(prompts[1]) == MATH.prompt(load_problems(["math500"], limit=2)[1], tok)
    monkeypatch.chdir(tmp_path)
    report = kvzap_compression.main(["--surrogate", str(tmp_path / "mlp"), "--thresholds=-inf,0,5", "--prompts", "2",
                                     "--max-new-tokens", "4", "--window", "4", "--batch-size", "2"])  # fmt: skip
    saved = json.loads((tmp_path / "runs/bench/kvzap_compression.json").read_text())
    removed = [r["compression_mean"] for r in saved["results"]]
    assert saved["prompts"] == report["prompts"] == 2
    assert removed[0] == 0.0 and saved["results"][0]["same_tokens_as_full"] == 1.0
    assert removed[0] <= removed[1] <= removed[2] and removed[2] > 0
    with pytest.raises(SystemExit):
        kvzap_compression.main(["--surrogate", str(tmp_path / "mlp"), "--thresholds=-6,x"])
    with pytest.raises(SystemExit):  # refused before any arm runs (the policy refused it after full KV's arm)
        kvzap_compression.main(["--surrogate", str(tmp_path / "missing"), "--thresholds=-6,nan"])
    for flag in ("--json", "--out"):  # --out as every bench takes it (README), --json the script's own name
        with pytest.raises(SystemExit):  # a file that cannot be written: refused before the sweep (a traceback after)
            kvzap_compression.main(["--surrogate", str(tmp_path / "missing"), "--thresholds=-6",
                                    flag, str(tmp_path / "runs/bench/kvzap_compression.json/x.json")])  # fmt: skip
        assert "is a file, so nothing can be written under it" in capsys.readouterr().err


def test_kvzip_refuses_a_chunked_prefill_before_scoring_a_chunk(tiny):
    """prefill_chunk=5 scored the first chunk as if it were the whole prompt; a left-padded batch whose first chunk
    held only pads for a short prompt ended in a bare ValueError('empty context') from the pretext builder."""
    model, tok, _ = tiny
    cache = build_policy({"policy": "kvzip"}, model.config, tok)
    scored = []
    cache._keep_mask = lambda prompt: scored.append(prompt)
    settings = DecodeSettings(max_new_tokens=2, progress=False, stop_token_ids=[], prefill_chunk=5)
    with pytest.raises(RuntimeError, match=r"prefill it in one step \(prefill_chunk=None\)"):
        generate(model, tok, [list(range(10, 22)), [7, 8]], cache, settings)
    assert scored == []  # refused before any chunk was scored


def test_a_surrogate_fitted_for_another_checkpoint_is_served_with_a_warning(tmp_path, caplog, monkeypatch):
    """``method.surrogate_dir`` is per model *name* by default (``runs/kvzap/${model.name}``), so every checkpoint of
    ``model=tiny-testbed`` shared one: surrogates fitted on one checkpoint's pairs scored another's rows without a
    word. The fit now records the model it fitted (``fitted_by.json``) and serving another says so."""
    from zoomr.models import tiny_config

    config = tiny_config("qwen2", vocab_size=64, num_hidden_layers=2)
    new_surrogate(config.hidden_size, config.num_key_value_heads, config.num_hidden_layers).save_pretrained(
        tmp_path / "s" / "mlp"
    )
    fitted, other = tmp_path / "ckpt_a", tmp_path / "ckpt_b"
    fitted.mkdir(), other.mkdir()
    method = {"name": "kvzap", "surrogate_dir": str(tmp_path / "s"), "threshold": -4.0}

    def served(name_or_path):
        config._name_or_path = str(name_or_path)
        with caplog.at_level("WARNING", logger="zoomr.cache.kvzap"):
            caplog.clear()
            build_policy(method, config)
        return [r.getMessage() for r in caplog.records]

    assert served(other) == []  # no record (a download, an older fit): nothing to compare
    (tmp_path / "s" / "mlp" / "fitted_by.json").write_text(json.dumps({"run_dir": "x", "model": str(fitted)}))
    assert served(fitted) == []
    said = served(other)
    assert len(said) == 1 and f"was fitted for {fitted}, not for the model served ({other})" in said[0]
    assert served(other) == []  # once per surrogate and model: the evaluator builds a cache for every batch
    from zoomr.kvzap.surrogate import model_identity

    monkeypatch.chdir(tmp_path)
    assert model_identity("ckpt_b") == str(other)  # a local checkpoint: resolved, as the fit records it
    assert model_identity("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B" and model_identity(None) is None  # a hub id as given
