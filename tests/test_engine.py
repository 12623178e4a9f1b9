"""Decode engine: sampling, stopping, forced tokens, per-step stats."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_spec
from zoomr.cache import ForcedInput, build_policy
from zoomr.cache.full import FullCache, FullConfig
from zoomr.engine import DecodeSettings, generate, mean_rows, sample_token
from zoomr.models import load_model_and_tokenizer


@pytest.fixture(scope="module")
def tiny2(cache_dir):
    return load_model_and_tokenizer(
        tiny_spec("qwen2", num_hidden_layers=2), cache_dir, attn_implementation="zoomr"
    )


def test_sample_token_rules():
    logits = torch.tensor([0.0, 3.0, 2.0, 1.0])
    assert sample_token(logits, DecodeSettings(temperature=0), None) == 1
    g = torch.Generator().manual_seed(0)
    draws = {sample_token(logits, DecodeSettings(temperature=1.0, top_k=2), g) for _ in range(200)}
    assert draws == {1, 2}  # top-k = 2 keeps tokens 1 and 2 only
    # top-p: p(1) = 0.64 < 0.7 -> the nucleus needs token 2 as well, never 3 or 0
    draws = {sample_token(logits, DecodeSettings(temperature=1.0, top_p=0.7), g) for _ in range(300)}
    assert draws == {1, 2}
    draws = {sample_token(logits, DecodeSettings(temperature=1.0, top_p=0.5), g) for _ in range(50)}
    assert draws == {1}


def test_bad_settings_fail_clearly():
    with pytest.raises(ValueError, match="max_new_tokens"):
        DecodeSettings(max_new_tokens=0)
    with pytest.raises(ValueError, match="sampling"):
        DecodeSettings(top_p=0)


@pytest.mark.parametrize(
    ("setting", "message"),
    [({"max_new_tokens": 2.5}, r"max_new_tokens=2.5 \(must be an int\)"),  # decoded 3 tokens
     ({"top_k": 2.5}, r"top_k=2.5 \(must be an int\)"),  # torch's TypeError at the first sample
     ({"temperature": True}, r"temperature=True \(must be a number\)"),  # sampled at T=1
     ({"seed": 1.5}, r"seed=1.5 \(must be an int"),  # truncated to 1
     ({"stop_strings": "\n\n"}, r"stop_strings='\\n\\n' \(must be a list of non-empty strings\)"),  # each char
     ({"stop_strings": [""]}, "must be a list of non-empty strings"),  # every sample stopped after one token
     ({"stop_token_ids": 2}, r"stop_token_ids=2 \(must be null or a list of token ids >= 0\)")],  # TypeError
)  # fmt: skip
def test_settings_of_the_wrong_type_are_refused_by_name(setting, message):
    with pytest.raises(ValueError, match=message):
        DecodeSettings(**setting)
    assert DecodeSettings(stop_strings=["\n\n"], stop_token_ids=(2,), seed=[1, 2]).stop_strings == ["\n\n"]


def test_bad_prompts_and_policies_fail_clearly(tiny2):
    """A string as the prompt list decoded each character as a prompt; an id outside the vocabulary (prompt or
    script) was torch's 'index out of range in self' from the embedding; a float id was truncated; a policy
    name where a config goes was OmegaConf's 'Input cfg is not an OmegaConf config object'."""
    model, tok = tiny2
    s = DecodeSettings(max_new_tokens=2, progress=False)
    vocab = model.get_input_embeddings().num_embeddings
    with pytest.raises(ValueError, match="prompts is one string: pass a list of prompts"):
        generate(model, tok, "What is 2 + 3?", None, s)
    with pytest.raises(ValueError, match=rf"prompt 1: {vocab} is not a token id of this model \(ints in \[0, {vocab}\)\)"):
        generate(model, tok, [[1, 2], [3, vocab]], None, s)
    with pytest.raises(ValueError, match="prompt 0: -1 is not a token id"):
        generate(model, tok, [[1, -1]], None, s)
    with pytest.raises(ValueError, match="prompt 0: 2.0 is not a token id"):
        generate(model, tok, [[1, 2.0]], None, s)
    with pytest.raises(ValueError, match="script 0: -1 is not a token id"):
        generate(model, tok, [[1, 2]], None, s, script=[[None, -1]])
    with pytest.raises(ValueError, match=r"not the name 'h2o': zoomr.configs.method_config\('h2o'\)"):
        generate(model, tok, [[1, 2]], "h2o", s)
    assert generate(model, tok, [[1, 2]], None, s, script=[[None, 3]])[0].token_ids[1] == 3


def test_a_prompt_past_max_position_embeddings_is_warned_about_unless_rope_scales(tiny2, monkeypatch, caplog):
    """A prompt longer than max_position_embeddings decoded without a word (as transformers does): positions the
    model never trained on. Rope scaling makes such prompts legitimate: no warning then."""
    model, tok = tiny2
    s = DecodeSettings(max_new_tokens=1, progress=False)
    monkeypatch.setattr(model.config, "max_position_embeddings", 4)
    with caplog.at_level("WARNING", logger="zoomr.engine"):
        generate(model, tok, [[1, 2, 3], [1, 2, 3, 4, 5]], None, s)
    assert "1 prompt(s) (first: prompt 1, 5 tokens) are longer than the model's max_position_embeddings=4" in caplog.text
    caplog.clear()
    monkeypatch.setattr(model.config, "rope_parameters", {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4})
    with caplog.at_level("WARNING", logger="zoomr.engine"):
        generate(model, tok, [[1, 2, 3, 4, 5]], None, s)
        generate(model, tok, [[1, 2, 3]], None, s)
    assert "max_position_embeddings" not in caplog.text


@pytest.mark.parametrize(("field", "value"), [("num_hidden_layers", 3), ("num_hidden_layers", 1), ("num_key_value_heads", 1)])
def test_a_cache_built_for_another_model_is_refused(tiny2, field, value):
    """A cache built from another model's config: more layers decoded without a word, fewer layers or KV heads
    were an IndexError / the store's shape error from inside the forward."""
    import copy

    model, tok = tiny2
    other = copy.deepcopy(model.config)
    setattr(other, field, value)
    with pytest.raises(ValueError, match=r"the cache was built for another model: \(layers, query heads, KV heads"):
        generate(model, tok, [[1, 2]], build_policy({"policy": "full"}, other), DecodeSettings(2, progress=False))


def test_sampling_is_per_sequence_reproducible(tiny2):
    """With per-sequence seeds a sampled sequence is the same alone or in a batch (eviction included)."""
    model, tok = tiny2
    prompts = ["first prompt here", "second", "a third, longer prompt than the others"]
    s = DecodeSettings(
        24, temperature=0.8, top_p=0.95, top_k=20, seed=[11, 12, 13], progress=False, stop_token_ids=[]
    )
    cfg = {"policy": "h2o", "budget_rows": 12}
    batch = generate(model, tok, prompts, cfg, s)
    for i, p in enumerate(prompts):
        single = generate(model, tok, [p], cfg, DecodeSettings(**{**vars(s), "seed": [11 + i]}))
        assert single[0].token_ids == batch[i].token_ids
    assert len({tuple(o.token_ids) for o in batch}) == 3


def test_stops_on_eos_and_stop_strings(tiny2):
    model, tok = tiny2
    prompt = "x"
    base = {
        "max_new_tokens": 12,
        "progress": False,
        "temperature": 1.0,
        "seed": 3,
    }  # the random model repeats greedily
    greedy = generate(model, tok, [prompt], None, DecodeSettings(**base, stop_token_ids=[]))[0]
    ids = greedy.token_ids
    i = next(k for k in range(2, 12) if ids[k] not in ids[:k])  # first new token after the start
    out = generate(model, tok, [prompt], None, DecodeSettings(**base, stop_token_ids=[ids[i]]))[0]
    assert out.stop_reason == "eos" and out.token_ids == ids[: i + 1] and not out.hit_cap
    assert out.text == tok.decode(ids[:i], skip_special_tokens=False)
    stop = tok.decode(ids[i : i + 1])
    settings = DecodeSettings(**base, stop_token_ids=[], stop_strings=[stop])
    out = generate(model, tok, [prompt], None, settings)[0]
    assert out.stop_reason == "stop_string" and out.text.endswith(stop) and out.n_tokens <= i + 1
    assert greedy.hit_cap and greedy.stop_reason == "length" and greedy.n_tokens == 12


class ForceOnce(FullCache):
    """Test policy: after sequence row 0's first sampled token, run ``tokens`` before its next one."""

    def __init__(self, *args, tokens, positions=None, from_last=True, **kwargs):
        super().__init__(*args, **kwargs)
        self.tokens, self.positions, self.from_last, self.done = tokens, positions, from_last, False

    def forced_inputs(self, sampled):
        if self.done or sampled[0] is None:
            return {}
        self.done = True
        return {0: ForcedInput(self.tokens, self.positions, sample_from_last=self.from_last)}


def test_forced_tokens_run_in_the_batch_and_are_not_sampled(tiny2):
    model, tok = tiny2
    prompt = tok("the forced one", add_special_tokens=False).input_ids
    other = "an ordinary sequence"
    s = DecodeSettings(10, progress=False, stop_token_ids=[])
    forced = [101, 202]
    cache = ForceOnce(FullConfig(), model.config, tokens=forced)
    out = generate(model, tok, [prompt, other], cache, s)
    x1 = out[0].token_ids[0]
    # sampled from the last forced token: the continuation of prompt + x1 + forced, which never enter the output
    ref = generate(model, tok, [prompt + [x1, *forced]], None, s)[0]
    assert out[0].token_ids[1:] == ref.token_ids[:9] and out[0].n_forced == 2 and out[0].n_tokens == 10
    assert out[1].token_ids == generate(model, tok, [other], None, s)[0].token_ids  # neighbour unaffected
    # sampled from the pending token's output instead: the first continuation is unchanged by the forcing
    cache = ForceOnce(FullConfig(), model.config, tokens=forced, from_last=False)
    plain = generate(model, tok, [prompt], None, s)[0]
    assert generate(model, tok, [prompt], cache, s)[0].token_ids[:2] == plain.token_ids[:2]


def test_forced_tokens_take_custom_positions(tiny2):
    model, tok = tiny2
    prompt = tok("positions", add_special_tokens=False).input_ids
    cache = ForceOnce(FullConfig(), model.config, tokens=[7, 8], positions=[1, 1], from_last=False)
    generate(model, tok, [prompt], cache, DecodeSettings(3, progress=False, stop_token_ids=[]))
    pos = cache.layers[0].store.rows().pos[0, 0].tolist()
    P = len(prompt)
    assert pos == [*range(P), P, 1, 1, P + 1]  # prompt, x1, two forced rows at position 1, x2
    assert int(cache.lengths[0]) == P + 2  # forced rows inside the span do not advance the logical length


def test_script_writes_the_environment_tokens_and_the_model_the_rest(tiny2):
    """Scripted positions hold the environment's ids; every model position is the greedy argmax of a full
    forward pass over the sequence so far (the engine's incremental decode agrees with one forward)."""
    model, tok = tiny2
    prompts = [tok("scripted", add_special_tokens=False).input_ids, tok("another prompt", add_special_tokens=False).input_ids]
    scripts = [[50, None, 51, 52, None, None, 53], [None, 60, None]]
    s = DecodeSettings(9, progress=False, stop_token_ids=[])
    out = generate(model, tok, prompts, None, s, script=scripts)
    for o, p, sc in zip(out, prompts, scripts):
        assert o.n_tokens == 9 and o.n_scripted == sum(t is not None for t in sc)
        assert [t for t, want in zip(o.token_ids, sc) if want is not None] == [t for t in sc if t is not None]
        logits = model(input_ids=torch.tensor([p + o.token_ids])).logits[0]
        for t, tok_id in enumerate(o.token_ids):
            if t >= len(sc) or sc[t] is None:  # the model's choice (past the script it writes freely)
                assert tok_id == int(logits[len(p) + t - 1].argmax())
    with pytest.raises(ValueError, match="scripts for"):
        generate(model, tok, prompts, None, s, script=scripts[:1])


def test_stats_per_step(tiny2):
    model, tok = tiny2
    cfg = {"policy": "streaming", "budget_rows": 12}
    out = generate(model, tok, ["a b c", "d"], cfg, DecodeSettings(20, progress=False, stop_token_ids=[]))
    st = out[0].stats
    L, H = 2, 2
    assert st.rows.shape == (20, L, H) and st.step.tolist() == list(range(20))
    assert (st.rows[-1] == 12).all() and st.select_s.sum() > 0 and (st.step_s > 0).all()
    assert (st.batch_size == 2).all() and mean_rows(out) <= 12
    cache = build_policy(cfg, model.config)
    every = generate(
        model, tok, ["a b c"], cache, DecodeSettings(20, progress=False, stop_token_ids=[], stats_every=5)
    )
    assert every[0].stats.step.tolist() == [0, 5, 10, 15]


class SeesInputs(FullCache):
    wants_attention_input = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []

    def on_attention_input(self, layer_idx, hidden_states):
        self.seen.append((self.steps_done, layer_idx, tuple(hidden_states.shape)))


def test_attention_input_hook(tiny2):
    model, tok = tiny2
    cache = SeesInputs(FullConfig(), model.config)
    generate(model, tok, ["a b", "c"], cache, DecodeSettings(3, progress=False, stop_token_ids=[]))
    D = model.config.hidden_size
    assert cache.seen[:2] == [(0, 0, (2, 2, D)), (0, 1, (2, 2, D))]  # prefill: both layers, padded batch
    assert [s[:2] for s in cache.seen[2:]] == [(1, 0), (1, 1), (2, 0), (2, 1)] and cache.seen[-1][2] == (
        2,
        1,
        D,
    )
