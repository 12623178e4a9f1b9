"""LightThinker on the recall testbed (issue 14): how a thought ends there (the model writes a splitter after
each paragraph break), the training streams (loss on model-written tokens only), serving a scripted trace with
the policy, the evaluator's refusal of a testbed without thought ends, and the miniature table."""

from __future__ import annotations

import pytest
import torch

from zoomr import tokens
from zoomr.abridge.layout import IGNORE, RAW
from zoomr.cache.lightthinker import LightThinkerMethod
from zoomr.lightthinker.layout import CACHE, CONTINUE, ThoughtTokens
from zoomr.schemas.testbed import TestbedData
from zoomr.testbed import task as tb
from zoomr.testbed import vocab as tt
from zoomr.testbed.grading import grade, load_test_problems, script_ids

N = 7  # the paper's n for a llama
DATA = {**vars(TestbedData(trace_tokens=256, n_train=12, query_form="cue", thought_splitter=True))}


@pytest.fixture(scope="module")
def tok():
    return tt.build_tokenizer()


def test_thought_splitter_keeps_the_problems_and_leaves_each_thought_end_to_the_model():
    plain, split = TestbedData(query_form="cue"), TestbedData(query_form="cue", thought_splitter=True)
    for i in range(3):
        a, b = tb.problem(plain, 0, i), tb.problem(split, 0, i)
        assert [w for w in b.response_words if w != tokens.SPLITTER] == a.response_words  # the same problem
        breaks = [j for j, w in enumerate(b.response_words) if w == tt.BREAK]
        splitters = [j for j, w in enumerate(b.response_words) if w == tokens.SPLITTER]
        assert len(breaks) == b.n_paragraphs and splitters == [j + 1 for j in breaks]  # one after every break
        assert set(splitters) <= set(b.model_writes)  # written by the model, trained with a loss
        assert len(b.model_writes) == len(a.model_writes) + len(splitters)
        assert [q.fact.key for q in b.queries] == [q.fact.key for q in a.queries]
    ra, rb = (load_test_problems(c, 2)[1] for c in (plain, split))
    assert ra["id"] == rb["id"] and ra["answer"] == rb["answer"]
    ga, gb = grade(ra, ra["response"]), grade(rb, rb["response"])  # splitters do not change the grading
    assert ga["correct"] and gb["correct"] and ga["recall_accuracy"] == gb["recall_accuracy"] == 1.0


def test_the_script_leaves_the_splitter_positions_to_the_model(tok):
    rec = load_test_problems(TestbedData(**DATA), 1)[0]
    script = script_ids(rec, tok)
    words = rec["response"].split(" ")
    assert all(script[j] is None for j, w in enumerate(words) if w == tokens.SPLITTER)
    assert sum(s is None for s in script) == len(rec["model_writes"])


def test_training_streams_compress_every_paragraph_and_score_only_model_written_tokens(tok):
    from train.lightthinker import load_streams, scripts_of

    lt = ThoughtTokens.from_tokenizer(tok, N)
    m = LightThinkerMethod(max_response_tokens=320, heldout_examples=2)
    streams = load_streams(DATA, tok, lt, m).streams
    cfg = TestbedData(**DATA)
    for i in (0, 7):
        s, p = streams[i], tb.problem(cfg, cfg.seed, i)
        ids, start = tt.FastEncoder(tok).chat(p.prompt_words, p.response_words)
        assert [t for t, k in zip(s.input_ids, s.kind) if k == RAW] == ids[start:]
        assert [t for t in s.labels if t != IGNORE] == [ids[start + j] for j in p.model_writes]
        assert s.kind.count(CACHE) == N * p.n_paragraphs and s.kind.count(CONTINUE) == p.n_paragraphs
        for j, t in enumerate(s.input_ids):  # every splitter is followed by the n cache tokens and <|continue|>
            if t == lt.splitter:
                assert s.input_ids[j + 1 : j + N + 2] == [*lt.cache, lt.cont]
    (script, *_) = scripts_of(streams[:1])
    _, response, loss = streams.example(0)
    assert [t for t in script if t is not None] == [t for j, t in enumerate(response) if j not in set(loss)]
    with pytest.raises(ValueError, match="thought_splitter=true"):
        load_streams({**DATA, "thought_splitter": False}, tok, lt, m)
    with pytest.raises(ValueError, match="max_response_tokens"):
        load_streams(DATA, tok, lt, LightThinkerMethod(max_response_tokens=200, heldout_examples=2))


def test_the_policy_frees_every_paragraph_of_a_scripted_trace(tok):
    """The engine runs the environment's script beside the policy's forced cache tokens: each paragraph is
    compressed when its splitter is written (here by the script, so an untrained model is enough) and the
    rows held stay bounded by the prompt, the compressed history and one open paragraph."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from zoomr.cache.lightthinker import LightThinkerCache
    from zoomr.engine import DecodeSettings, generate

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1))
    recs = load_test_problems(TestbedData(**DATA), 2)
    lt = ThoughtTokens.from_tokenizer(tok, N)
    scripts = [[lt.splitter if s is None and w == tokens.SPLITTER else s
                for s, w in zip(script_ids(r, tok), r["response"].split(" ") + [tokens.IM_END])] for r in recs]
    enc = tt.FastEncoder(tok)
    settings = DecodeSettings(max_new_tokens=400, stop_token_ids=[enc.im_end], progress=False)
    cache = LightThinkerCache(LightThinkerMethod(), model.config, tok, num_cache_tokens=N)
    outs = generate(model.eval(), tok, [enc.prompt(r["prompt"].split()) for r in recs], cache, settings, scripts)
    for r, o in zip(recs, outs):
        assert o.n_tokens == r["response_tokens"] + 1 and o.n_forced == (N + 1) * r["n_paragraphs"]
        longest = max(len(p.split(" ")) for p in r["response"].split(tt.BREAK))  # a paragraph + its splitter
        bound = len(enc.prompt(["recall"])) + (N + 1) * r["n_paragraphs"] + longest + N + 2
        assert int(o.stats.rows.max()) <= bound < r["response_tokens"]


def test_eval_refuses_lightthinker_on_a_testbed_without_thought_ends(tok):
    from eval.tasks import get_task
    from eval.testbed_task import testbed_problems

    task, method = get_task("testbed"), {"policy": "lightthinker"}
    opts = {"trace_tokens": 256, "n_test": 2, "query_form": "cue"}
    with pytest.raises(ValueError, match=r"thought_splitter=true"):
        task.check_policy(testbed_problems(opts), method)
    task.check_policy(testbed_problems(opts), None)  # other policies run as before
    opts = {**opts, "thought_splitter": True}
    problems = testbed_problems(opts)
    task.check_policy(problems, method)
    assert task.script(problems[0], tok).count(None) == len(problems[0].meta["record"]["model_writes"])


def test_miniature_table_composes_into_the_schemas(tmp_path):
    from hydra import compose, initialize_config_dir

    from analysis.miniature_lightthinker import ARMS, MODELS
    from zoomr.entry import CONF_DIR
    from zoomr.schemas import register_with_hydra, to_dataclass

    register_with_hydra()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        for model in MODELS.values():
            cfg = compose("train", overrides=[o.format(base=tmp_path) for o in model["overrides"]])
            m = to_dataclass(LightThinkerMethod, cfg.method)
            assert m.init_from == str(tmp_path) and m.max_response_tokens >= 1024 + 64
            assert TestbedData(**cfg.data).thought_splitter and cfg.model.name == "tiny-testbed"
        arm = ARMS["lightthinker"]
        cfg = compose("eval", overrides=["benchmark=testbed", f"+method={arm['method']}", *arm["overrides"]])
        assert cfg.method.policy == "lightthinker" and cfg.benchmark.options.thought_splitter is True
        assert {a["model"] for a in ARMS.values()} <= {*MODELS, "base"}
        assert all(a.get("match") in (None, *ARMS) for a in ARMS.values())
