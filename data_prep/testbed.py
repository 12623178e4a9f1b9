"""A synthetic long-trace recall task on which KV-cache compression can win or lose (``data=testbed``).

MQAR-style associative recall (keys defined once, queried once, only the definition holds the
binding) laid out as a chat example whose assistant response is a long "reasoning trace" of
paragraphs, generated greedily by the model and graded exactly (:mod:`data_prep.testbed_grading`).

Example (``summaries=true``; ``"\\n\\n"`` is one token, ``<bs>``/``<es>`` are the summary delimiters)::

    user:      values #3 v7 #1 v30 #2 v5 … plan P1 k55 k9 w3 P2 k101 Q55 w2 … \\boxed{ Q9 … }
    assistant: P1 #1 k55 v30 #2 k9 v5 w3 w2 w1 <bs> P1 k55 k9 <es> \\n\\n
               P2 #3 k101 v7 Q55 v30 w2 w1 <bs> P2 k101 <es> \\n\\n … \\boxed{ Q9 v5 … }

Paragraph i writes its new facts ``#j k v`` (fact index, key, value), answers its queries ``Q<k> v``
about facts of EARLIER paragraphs, then a countdown filler ``w_L … w_1`` that carries nothing.
The final ``\\boxed{}`` recalls the earliest facts still unqueried (the longest distances).

Why the prompt determines the whole trace, yet cannot answer a query (the no-shortcut argument)
----------------------------------------------------------------------------------------------
Greedy decoding makes the trace a function of the prompt, and the prompt is never compressed. So the
prompt must fix every token of the trace without holding any key→value binding:

* The *plan* lists, per paragraph, the keys to define (in order), the keys to query (as ``Q<k>``
  tokens) and the filler length: no values at all.
* The *value list* gives each fact INDEX its value, ``#j v``, in shuffled order: no keys at all.
* Only the trace's definition ``#j k v`` joins key k to index j (the j-th key the trace defines), and
  thereby to its value. A query ``Q<k>`` can be answered from the definition (one attention hop:
  find the value whose previous token is k), or from the prompt only by computing k's rank j among
  all defined keys of the plan (exact counting to ~100 over a variable-length plan) and then
  looking up ``#j``: not an attention-sized computation, never rewarded in training (the definition
  is always there), and the value list is shuffled so no position of the plan lines up with it.
  Evicting the definitions must therefore hurt; the results table (StreamingLLM at 25% of the
  rows) checks it empirically.
* Every generation step, by contrast, needs only local or prompt information: the next plan token
  (copied from the plan: keys, ``Q`` tokens and ``P`` markers are unique in it), the next index
  (``#j`` follows ``#(j-1)``: the largest index so far), the value of ``#j`` (looked up in the value
  list), the countdown. So the correct trace, every definition and every answer, is fixed by the
  prompt, one exact grader works, and per-fact recall is meaningful.

Methods: paragraphs (``"\\n\\n"``-separated) are ZoomR segments; a summary is lossy (it names the
paragraph and the keys it defined, never their values), so it can point at the paragraph that holds
a fact but not replace it (SumR cannot answer); 1,024-token traces span 8-16 AbridgeKV blocks at
C = 64-128; filler carries nothing (a good KVzap surrogate evicts it).
"""

from __future__ import annotations

import logging
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from data_prep import testbed_tokenizer as tt
from zoomr import tokens
from zoomr.schemas.testbed import TestbedData

log = logging.getLogger(__name__)


@dataclass
class Fact:
    index: int  # 1-based definition order (the #j token)
    key: int
    value: int
    paragraph: int


@dataclass
class Query:
    fact: Fact
    paragraph: int  # paragraph that asks it; 0 = the final \boxed{} answer
    answer_pos: int = -1  # response position of the answer value token
    definition_pos: int = -1  # response position of the definition's value token

    @property
    def distance(self) -> int:
        """Tokens from the definition's value to the answer (how far back the fact is)."""
        return self.answer_pos - self.definition_pos


@dataclass
class Paragraph:
    number: int
    facts: list[Fact]
    queries: list[Query]
    filler: int


@dataclass
class Problem:
    prompt_words: list[str]
    response_words: list[str]
    facts: list[Fact]
    queries: list[Query]  # in trace order; the final ones last
    n_paragraphs: int
    summaries: bool
    answer_positions: list[int] = field(default_factory=list)  # response positions of every answer value

    def record(self, problem_id: str) -> dict[str, Any]:
        """JSON-serialisable test record (the grader's ``prompt_record``)."""
        final = [q for q in self.queries if q.paragraph == 0]
        return {
            "id": problem_id,
            "prompt": " ".join(self.prompt_words),
            "response": " ".join(self.response_words),
            "messages": messages(self.prompt_words, self.response_words),
            "answer": " ".join(w for q in final for w in (tt.query(q.fact.key), tt.value(q.fact.value))),
            "queries": [
                {
                    "key": tt.key(q.fact.key),
                    "value": tt.value(q.fact.value),
                    "index": q.fact.index,
                    "defined_in": q.fact.paragraph,
                    "asked_in": q.paragraph,
                    "final": q.paragraph == 0,
                    "distance": q.distance,
                }
                for q in self.queries
            ],
            "facts": [asdict(f) for f in self.facts],
            "n_paragraphs": self.n_paragraphs,
            "summaries": self.summaries,
            "response_tokens": len(self.response_words),
            "prompt_tokens": len(self.prompt_words),
        }


def messages(prompt_words: list[str], response_words: list[str]) -> list[dict[str, str]]:
    return [
        {"role": "user", "content": " ".join(prompt_words)},
        {"role": "assistant", "content": " ".join(response_words)},
    ]


def paragraph_cost(n_facts: int, n_queries: int, filler: int, summaries: bool) -> int:
    """Response tokens of one paragraph: marker, 3 per fact, 2 per query, filler, summary, break."""
    return 1 + 3 * n_facts + 2 * n_queries + filler + (3 + n_facts if summaries else 0) + 1


def _range(r: list[int], what: str) -> tuple[int, int]:
    if len(r) != 2 or r[0] > r[1] or r[0] < 0:
        raise ValueError(f"testbed.{what} must be [lo, hi] with 0 <= lo <= hi, got {r}")
    return int(r[0]), int(r[1])


def validate(cfg: TestbedData) -> None:
    lo, hi = _range(cfg.facts_per_paragraph, "facts_per_paragraph")
    if lo < 1:
        raise ValueError("testbed.facts_per_paragraph: every paragraph defines at least one fact")
    _range(cfg.queries_per_paragraph, "queries_per_paragraph")
    _, fhi = _range(cfg.filler, "filler")
    if fhi > tt.N_FILLER:
        raise ValueError(f"testbed.filler: at most {tt.N_FILLER} filler tokens per paragraph, got {fhi}")
    if cfg.final_queries < 1:
        raise ValueError("testbed.final_queries must be >= 1")
    if cfg.trace_tokens < paragraph_cost(hi, 0, 0, cfg.summaries) + 2 + 2 * cfg.final_queries:
        raise ValueError(f"testbed.trace_tokens={cfg.trace_tokens} is too short for one paragraph and the answer")


def _pick(rng: random.Random, eligible: list[Fact], bias: float) -> Fact:
    """One fact, weight (age rank + 1) ** bias (rank 0 = the newest eligible fact)."""
    if bias == 0:
        return eligible[rng.randrange(len(eligible))]
    weights = [(len(eligible) - i) ** bias for i in range(len(eligible))]
    return rng.choices(eligible, weights=weights)[0]


def generate(cfg: TestbedData, rng: random.Random) -> Problem:
    """One problem. All randomness comes from ``rng``; the result depends on nothing else."""
    validate(cfg)
    keys = rng.sample(range(tt.N_KEYS), tt.N_KEYS)
    reserve = 2 + 2 * cfg.final_queries  # \boxed{ Q v … }
    paragraphs: list[Paragraph] = []
    facts: list[Fact] = []
    unqueried: list[Fact] = []  # facts of earlier paragraphs not yet queried, oldest first
    used = 0
    while True:
        number = len(paragraphs) + 1
        n_facts = rng.randint(*cfg.facts_per_paragraph)
        n_queries = min(rng.randint(*cfg.queries_per_paragraph), len(unqueried))
        n_filler = rng.randint(*cfg.filler)
        cost = paragraph_cost(n_facts, n_queries, n_filler, cfg.summaries)
        if used + cost + reserve > cfg.trace_tokens:
            break
        if number > tt.N_PARAGRAPHS or len(facts) + n_facts > min(tt.N_INDEX, tt.N_KEYS):
            raise ValueError(
                f"testbed.trace_tokens={cfg.trace_tokens} needs more than {tt.N_PARAGRAPHS} paragraphs or "
                f"{min(tt.N_INDEX, tt.N_KEYS)} facts: lengthen the filler or enlarge the vocabulary"
            )
        asked = []
        for _ in range(n_queries):
            fact = _pick(rng, unqueried, cfg.query_age_bias)
            unqueried.remove(fact)
            asked.append(Query(fact, number))
        new = [Fact(len(facts) + m + 1, keys[len(facts) + m], rng.randrange(tt.N_VALUES), number) for m in range(n_facts)]
        facts += new
        paragraphs.append(Paragraph(number, new, asked, n_filler))
        unqueried += new
        used += cost
    if not paragraphs:
        raise ValueError(f"testbed.trace_tokens={cfg.trace_tokens}: not even one paragraph fits")
    final = [Query(f, 0) for f in sorted(unqueried, key=lambda f: f.index)[: cfg.final_queries]]
    value_list = facts[:]
    rng.shuffle(value_list)
    return _render(paragraphs, final, facts, value_list, cfg.summaries)


def _render(
    paragraphs: list[Paragraph], final: list[Query], facts: list[Fact], value_list: list[Fact], summaries: bool
) -> Problem:
    prompt = [tt.VALUES_HEADER]
    for f in value_list:
        prompt += [tt.index(f.index), tt.value(f.value)]
    prompt.append(tt.PLAN_HEADER)
    response: list[str] = []
    value_pos: dict[int, int] = {}
    queries: list[Query] = []

    def answer(q: Query) -> None:
        response.append(tt.query(q.fact.key))
        q.answer_pos, q.definition_pos = len(response), value_pos[q.fact.index]
        response.append(tt.value(q.fact.value))
        queries.append(q)

    for p in paragraphs:
        prompt += [tt.paragraph(p.number), *(tt.key(f.key) for f in p.facts), *(tt.query(q.fact.key) for q in p.queries)]
        prompt += [tt.filler(p.filler)] if p.filler else []
        response.append(tt.paragraph(p.number))
        for f in p.facts:
            response += [tt.index(f.index), tt.key(f.key)]
            value_pos[f.index] = len(response)
            response.append(tt.value(f.value))
        for q in p.queries:
            answer(q)
        response += [tt.filler(n) for n in range(p.filler, 0, -1)]
        if summaries:
            response += [tokens.BEGIN_SUMMARY, tt.paragraph(p.number), *(tt.key(f.key) for f in p.facts), tokens.END_SUMMARY]
        response.append(tt.BREAK)
    prompt += [tt.BOXED, *(tt.query(q.fact.key) for q in final), tt.CLOSE]
    response.append(tt.BOXED)
    for q in final:
        answer(q)
    response.append(tt.CLOSE)
    return Problem(
        prompt_words=prompt,
        response_words=response,
        facts=facts,
        queries=queries,
        n_paragraphs=len(paragraphs),
        summaries=summaries,
        answer_positions=[q.answer_pos for q in queries],
    )


def problems(cfg: TestbedData, n: int, seed: int, start: int = 0) -> list[Problem]:
    """``n`` problems; problem ``i`` uses its own generator seeded by (seed, i), so any prefix is stable."""
    return [generate(cfg, random.Random(f"testbed/{seed}/{i}")) for i in range(start, start + n)]


def sft_dataset(data: dict[str, Any], tokenizer=None):
    """``datasets.Dataset`` of chat ``messages`` (the ``data.loader`` protocol of ``+method=sft``)."""
    import datasets

    cfg = TestbedData(**data)
    rows = [
        {"messages": messages(p.prompt_words, p.response_words), "id": f"testbed-train-{cfg.seed}-{i}"}
        for i, p in enumerate(problems(cfg, cfg.n_train, cfg.seed))
    ]
    return datasets.Dataset.from_list(rows)
