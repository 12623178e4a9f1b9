"""KVzap pairs from recall-testbed traces (``python -m data_prep +pipeline=kvzap_pairs_testbed``).

The testbed source of :mod:`data_prep.kvzap_pairs`: a document is one testbed problem of a training
stream (``pipeline.testbed.seed``, disjoint from the evaluator's test seeds), as the model sees it when
served: the chat prompt and the whole response (facts, filler, queries, the answers in place, the final
``\\boxed{}`` list), teacher-forced. The hidden states h_i are therefore the base model's own attention
inputs on the trace, at the positions the KVzap policy scores them in serving.

The pretext (KVzap paper §3.1; KVzip): KVzip scores a KV pair by the attention it receives while the model
reconstructs its context. The literal repeat (``user: ctx \\n\\nRepeat the previous context exactly.
assistant: ctx``) does not apply here: the word-level testbed vocabulary has none of the instruction's
words (they would all be ``[UNK]``), and the trained base model no longer copies (a trace followed by
itself: 5% next-token accuracy on the repeat, 5 traces). ``pretext=recall`` (default) reconstructs the
context's content through the model's own task instead: the trace's closing ``} <|im_end|>`` is held back
and the ``\\boxed{}`` list goes on with one cue query ``? k : = v`` per fact the trace defined (shuffled with
the seed; the model answers them at 0.82-0.87 teacher-forced on 4 traces); every token of those queries
is a scoring query t of KVzip+ (:func:`zoomr.kvzap.scoring.kvzip_scores`). The two held-back tokens are
the last of a served sequence and so always inside KVzap's window: no pair is lost by scoring without
them. ``pretext=copy`` is the literal repeat without an instruction (context, then the context again,
the layout of the model's copy warm-up), a labelled variant.
"""

from __future__ import annotations

import random
from dataclasses import asdict
from pathlib import Path

import torch

from zoomr.jsonl import read_json_object
from zoomr.kvzap.pretext import RepeatPretext
from zoomr.schemas.checks import SettingsError
from zoomr.schemas.kvzap import TestbedPairsSource
from zoomr.schemas.testbed import TestbedData
from zoomr.testbed import task as testbed
from zoomr.testbed import vocab as tt
from zoomr.testbed.checkpoint import QUERY_FORMAT_FIELDS, format_differences

FORMAT_FIELDS = (*QUERY_FORMAT_FIELDS, "summaries", "model_writes_summaries", "n_keys")


def testbed_data(source: TestbedPairsSource, model_dir: str | None = None) -> TestbedData:
    """The task distribution of the pairs: ``source.data`` over the defaults, checked against the model's.

    A model directory with ``testbed_data.json`` (written by ``+method=sft_testbed``) fixes the trace
    format: a different ``query_form``/``summaries``/... is refused, and so is a seed the model was trained
    or tested on.
    """
    unknown = sorted(set(source.data) - set(TestbedData.__dataclass_fields__))
    if unknown:
        raise SettingsError(f"pipeline.testbed.data: unknown TestbedData fields {unknown}")
    data = TestbedData(**{**source.data, "seed": source.seed})
    testbed.validate(data)
    path = Path(model_dir) / "testbed_data.json" if model_dir else None
    if path is not None and path.exists():
        trained = read_json_object(path, "testbed data config")
        if differ := format_differences(model_dir, data, FORMAT_FIELDS):
            raise SettingsError(
                f"pipeline.testbed.data disagrees with the model's trace format ({path}): "
                + ", ".join(f"{k}: model {a!r}, pairs {b!r}" for k, (a, b) in differ.items())
            )
        used = {trained.get("seed"), trained.get("test_seed")}
        if source.seed in used:
            raise SettingsError(
                f"pipeline.testbed.seed={source.seed} is a seed the model was trained or tested on ({path}): "
                "choose another"
            )
    return data


def context_ids(problem: testbed.Problem, enc: tt.FastEncoder, pretext: str) -> list[int]:
    """The scored context: the served conversation (``recall``: without its closing ``} <|im_end|>``)."""
    ids, _ = enc.chat(problem.prompt_words, problem.response_words)
    if pretext == "copy":
        return ids
    if ids[-2] != enc.ids[tt.CLOSE]:
        raise ValueError("a testbed response must end with '}' <|im_end|> for the recall pretext")
    return ids[:-2]


def testbed_pieces(source: TestbedPairsSource, data: TestbedData, tokenizer) -> list[tuple[str, str, list[int]]]:
    """(split, origin, context ids) of problems ``0..n_val+n_train-1``: ``n_val`` held out first, then train."""
    enc = tt.FastEncoder(tokenizer)
    return [
        ("val" if i < source.n_val else "train", f"testbed/{source.seed}/{i}",
         context_ids(testbed.problem(data, source.seed, i), enc, source.pretext))
        for i in range(source.n_val + source.n_train)
    ]  # fmt: skip


def settings(source: TestbedPairsSource, data: TestbedData) -> dict:
    """What the pairs depend on (recorded in plan.json)."""
    return {"source": asdict(source), "data": asdict(data)}


def recall_queries(problem: testbed.Problem, enc: tt.FastEncoder, shuffle: str) -> list[int]:
    """One cue query per fact of ``problem``, in an order shuffled by ``shuffle``: the recall scoring span."""
    facts = list(problem.facts)
    random.Random(shuffle).shuffle(facts)
    return [i for f in facts for i in enc.words(testbed.query_words(f, problem.query_form))]


def build_testbed_pretext(source: TestbedPairsSource, data: TestbedData, tokenizer, index: int) -> RepeatPretext:
    """The pretext of problem ``index`` of the stream: its context, then recall queries (or its copy)."""
    enc = tt.FastEncoder(tokenizer)
    p = testbed.problem(data, source.seed, index)
    ctx = context_ids(p, enc, source.pretext)
    tail = ctx if source.pretext == "copy" else recall_queries(p, enc, f"kvzap-recall/{source.seed}/{index}")
    return RepeatPretext(torch.tensor([ctx + tail]), (0, len(ctx)), (len(ctx), len(ctx) + len(tail)))
