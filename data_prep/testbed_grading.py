"""Exact grader and test-problem loader of the recall testbed (``benchmark=testbed`` in the evaluator).

The correct trace is a function of the prompt (see :mod:`data_prep.testbed`), so grading compares the
model's greedy output with the prompt-determined truth, never with the model's own definitions:

* ``correct``: the last ``\\boxed{…}`` holds exactly the gold ``Q<k> v`` pairs (the final answer).
* per-fact recall: for every query of the problem (paragraph queries and the final ones), the value
  the model wrote after the first ``Q<k>`` it generated, compared with the truth, with the reference
  distance (tokens from the definition's value to the answer in the correct trace).
* ``definitions_correct``: fraction of the model's ``#j k v`` definitions that match the truth (a
  trace that drifts from the plan shows here, not as a recall error).
* ``trace_exact``: the whole response equals the reference token for token (special tokens ignored,
  so it holds whether or not the decoder skipped them).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from data_prep import testbed_tokenizer as tt
from data_prep.testbed import problems
from zoomr import tokens
from zoomr.schemas.testbed import TestbedData

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


def _words(text: str) -> list[str]:
    words = text.split()
    if tt.PLAN_HEADER in words and "assistant" in words:  # a full transcript: keep the response only
        words = words[len(words) - words[::-1].index("assistant") :]
    return [w for w in words if w not in _SPECIAL or w in (tokens.BEGIN_SUMMARY, tokens.END_SUMMARY)]


def _boxed(words: list[str]) -> list[str] | None:
    if tt.BOXED not in words:
        return None
    start = len(words) - words[::-1].index(tt.BOXED)
    end = words.index(tt.CLOSE, start) if tt.CLOSE in words[start:] else len(words)
    return words[start:end]


def _first_answers(words: Iterable[str]) -> dict[str, str]:
    """key word → the word the model wrote right after its first ``Q<key>``."""
    out: dict[str, str] = {}
    words = list(words)
    for a, b in zip(words, words[1:]):
        if a.startswith("Q") and a[1:].isdigit():
            out.setdefault("k" + a[1:], b)
    return out


def _definitions(words: list[str]) -> dict[str, str]:
    """key word → value word of the model's ``#j k v`` definitions (first definition of a key)."""
    out: dict[str, str] = {}
    for a, k, v in zip(words, words[1:], words[2:]):
        if a.startswith("#") and k.startswith("k"):
            out.setdefault(k, v)
    return out


def grade(prompt_record: dict[str, Any], generated_text: str) -> dict[str, Any]:
    """Grade one generated response against its problem record (from :func:`load_test_problems`)."""
    words = _words(generated_text)
    boxed = _boxed(words)
    gold = prompt_record["answer"].split()
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
    defs = _definitions(words)
    reference = [w for w in prompt_record["response"].split() if w not in _SPECIAL or w in (tokens.BEGIN_SUMMARY, tokens.END_SUMMARY)]
    return {
        "id": prompt_record["id"],
        "correct": boxed == gold,
        "extracted": " ".join(boxed) if boxed is not None else None,
        "recall": recall,
        "recall_accuracy": sum(r["correct"] for r in recall) / max(1, len(recall)),
        "definitions_correct": sum(defs.get(f"k{f['key']}") == tt.value(f["value"]) for f in prompt_record["facts"])
        / max(1, len(prompt_record["facts"])),
        "trace_exact": words == reference,
        "distances": [q["distance"] for q in prompt_record["queries"]],
        "generated_tokens": len(words),
    }


def summarize(grades: list[dict[str, Any]]) -> dict[str, Any]:
    """Answer accuracy, recall overall and by distance bucket, definition and trace fidelity."""
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
    out["definitions_correct"] = sum(g["definitions_correct"] for g in grades) / max(1, len(grades))
    out["trace_exact"] = sum(g["trace_exact"] for g in grades) / max(1, len(grades))
    return out
