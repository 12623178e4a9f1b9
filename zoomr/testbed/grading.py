"""Exact grader and test-problem loader of the recall testbed (``benchmark=testbed`` in the evaluator).

Grading compares the model's output with the problem's truth, never with anything the model wrote:

* ``correct``: the last ``\\boxed{…}`` holds exactly the gold queries and answers (the final answer).
* per-fact recall: for every query of the problem (paragraph queries and the final ones), the value
  the model wrote after the first ``? k`` of the response (``? k : = v`` or ``? k v``), with the
  reference distance (tokens from the definition's value to the answer).
* ``summaries_exact`` (traces with summaries): fraction of summary blocks equal to the reference's.

Parsing is positional only within one query, so a response decoded with or without the
environment's script (:func:`script_ids`) is graded the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from zoomr import tokens
from zoomr.schemas.testbed import TestbedData
from zoomr.testbed import vocab as tt
from zoomr.testbed.task import problems

BUCKETS = ((0, 64, "<64"), (64, 257, "64-256"), (257, 1 << 30, ">256"))
_SPECIAL = set(tokens.ALL_SPECIAL_TOKENS)


def bucket(distance: int) -> str:
    return next(name for lo, hi, name in BUCKETS if lo <= distance < hi)


def load_test_problems(data: TestbedData | dict[str, Any], n: int | None = None) -> list[dict[str, Any]]:
    """The fixed test set: ``n`` (default ``data.n_test``) problems from ``data.test_seed``."""
    cfg = data if isinstance(data, TestbedData) else TestbedData(**data)
    count = cfg.n_test if n is None else n
    return [p.record(f"testbed-{cfg.test_seed}-{i}") for i, p in enumerate(problems(cfg, count, cfg.test_seed))]


def prompt_messages(record: dict[str, Any]) -> list[dict[str, str]]:
    """The chat prompt to generate from (apply the chat template with ``add_generation_prompt=True``)."""
    return [{"role": "user", "content": record["prompt"]}]


def script_ids(record: dict[str, Any], tokenizer) -> list[int | None]:
    """The environment's script for ``zoomr.engine.generate``: every response token id, ``None`` where the
    model writes, then ``<|im_end|>`` (the end of the turn)."""
    vocab = tokenizer.get_vocab()
    words = record["response"].split(" ")
    try:
        ids: list[int | None] = [vocab[w] for w in words]
    except KeyError as e:
        raise ValueError(f"testbed record {record.get('id')}: word {e.args[0]!r} is not in the tokenizer") from None
    for pos in record["model_writes"]:
        ids[pos] = None
    return [*ids, vocab[tokens.IM_END]]


def _words(text: str) -> list[str]:
    words = text.split()
    if "assistant" in words:  # a full transcript: keep the response only
        words = words[len(words) - words[::-1].index("assistant") :]
    return [w for w in words if w not in _SPECIAL or w in (tokens.BEGIN_SUMMARY, tokens.END_SUMMARY)]


def _boxed(words: list[str]) -> list[str] | None:
    if tt.BOXED not in words:
        return None
    start = len(words) - words[::-1].index(tt.BOXED)
    end = words.index(tt.CLOSE, start) if tt.CLOSE in words[start:] else len(words)
    return words[start:end]


def _first_answers(words: Iterable[str]) -> dict[str, str]:
    """key word → the answer written after the first query of that key: ``? k v`` (inline), ``? k : = v``
    (cue) or ``? t k : = v`` (cue naming a paragraph topic; the key is the word before ``:``)."""
    out: dict[str, str] = {}
    words = list(words)
    for i, a in enumerate(words[:-2]):
        if a != tt.QUERY:
            continue
        key, j = words[i + 1], i + 2
        for end in (i + 2, i + 3):  # the cue form: ":" right after the key, or after the topic and the key
            if words[end : end + 2] == [tt.QUERY_END, tt.ANSWER_MARK]:
                key, j = words[end - 1], end + 2
                break
        if j < len(words):
            out.setdefault(key, words[j])
    return out


def _summary_blocks(words: list[str]) -> list[list[str]]:
    blocks, cur = [], None
    for w in words:
        if w == tokens.BEGIN_SUMMARY:
            cur = []
        elif w == tokens.END_SUMMARY and cur is not None:
            blocks.append(cur)
            cur = None
        elif cur is not None:
            cur.append(w)
    return blocks


def grade_answer(generated_text: str, gold: str) -> tuple[str | None, bool]:
    """(the last ``\\boxed{}`` content, whether it is exactly the gold queries and answers)."""
    boxed = _boxed(_words(generated_text))
    return (" ".join(boxed) if boxed is not None else None), boxed == gold.split()


def grade(prompt_record: dict[str, Any], generated_text: str) -> dict[str, Any]:
    """Grade one generated response against its problem record (from :func:`load_test_problems`)."""
    words = _words(generated_text)
    extracted, correct = grade_answer(generated_text, prompt_record["answer"])
    answers = _first_answers(words)
    recall = []
    for q in prompt_record["queries"]:
        pred = answers.get(q["key"])
        recall.append(
            {
                "key": q["key"],
                "distance": q["distance"],
                "bucket": bucket(q["distance"]),
                "final": q["final"],
                "predicted": pred,
                "correct": pred == q["value"],
            }
        )
    out = {
        "id": prompt_record["id"],
        "correct": correct,
        "extracted": extracted,
        "recall": recall,
        "recall_accuracy": sum(r["correct"] for r in recall) / max(1, len(recall)),
        "generated_tokens": len(words),
    }
    if prompt_record["summaries"]:
        ref = _summary_blocks(_words(prompt_record["response"]))
        gen = _summary_blocks(words)
        out["summaries_exact"] = sum(a == b for a, b in zip(ref, gen)) / max(1, len(ref))
    return out


def summarize(grades: list[dict[str, Any]]) -> dict[str, Any]:
    """Answer accuracy, recall overall and by distance bucket (and summary fidelity when there are summaries)."""
    recalls = [r for g in grades for r in g["recall"]]
    out: dict[str, Any] = {
        "problems": len(grades),
        "answer_accuracy": sum(g["correct"] for g in grades) / max(1, len(grades)),
        "recall_all": sum(r["correct"] for r in recalls) / max(1, len(recalls)),
        "recall_n": len(recalls),
    }
    for *_, name in BUCKETS:
        sel = [r["correct"] for r in recalls if r["bucket"] == name]
        out[f"recall_{name}"] = sum(sel) / len(sel) if sel else float("nan")
        out[f"recall_{name}_n"] = len(sel)
    with_summaries = [g["summaries_exact"] for g in grades if "summaries_exact" in g]
    if with_summaries:
        out["summaries_exact"] = sum(with_summaries) / len(with_summaries)
    return out
