"""A synthetic long-trace recall task on which KV-cache compression can win or lose (``data=testbed``).

MQAR-style associative recall (keys defined once, queried once, only the definition holds the
binding; shared/specs/TESTBED_NOTES.md) laid out as a chat example whose assistant response is a long
"reasoning trace" of paragraphs, graded exactly (:mod:`zoomr.testbed.grading`).

Example (``summaries=true``; ``"\\n\\n"`` is one token, ``<bs>``/``<es>`` are the summary delimiters)::

    user:      recall
    assistant: w17 w3 … k55 v30 k9 v5 k201 v7 w40 … <bs> k55 k9 k201 <es> \\n\\n
               w8 … k101 v12 k3 v30 k77 v1 w2 ? k9 : = [v5] <bs> k101 k3 k77 <es> \\n\\n
               … \\boxed{ ? k55 : = [v30] ? k201 : = [v7] … }

A query (``query_form=cue``, issue 13) is a cue ``? k``, then the semantic boundary ``:`` (ZoomR A.3), then
one more token ``=`` and the value: a recompute at ``:`` sees the key, and the selection it makes applies
from the next step, the one that predicts the value (a real trace says "recall the value of x: …", not
the value on the token after the key). ``query_form=inline`` is the format before issue 13, ``? k v``.

Paragraph topics (``paragraph_topics=true``, issue 13, a format variant): a paragraph opens with a topic word
``t`` (a key word that no fact of the problem uses), its summary is ``<bs> t <es>``, and a query names the
topic before the key, ``? t k : = v``. A summary then points at its paragraph with one word, as a real
summary's words are all about its paragraph, instead of averaging 3-4 unrelated keys.

A paragraph is: filler words, 3-4 new facts ``k v`` (a fresh key, a uniformly random value), a little
more filler, then 1-3 queries ``? k v`` about facts of EARLIER paragraphs (each fact is queried at most
once, so the definition is the only copy of its binding), then the optional summary and the paragraph
break. The final ``\\boxed{}`` queries the earliest facts still unqueried (the longest distances).

Who writes what. The facts, the filler and the choice of queries are random, so no model can write them
and no prompt may hold them (the prompt would become a second copy of every binding). They are the
*environment's* tokens, like tool outputs in an agentic trace: the decode engine feeds them as a
script (``zoomr.engine.generate(script=…)``) through the ordinary decode loop, one token per step, so
every cache policy sees and evicts them exactly as it would its own tokens. The model writes every
answer value (``[v…]`` above) greedily, and its answers stay in the context whether right or wrong;
with ``model_writes_summaries`` it also writes each summary's keys. Training puts the loss on exactly
the positions the model writes (:attr:`Problem.model_writes`).

Thought ends (``thought_splitter=true``, LightThinker). The environment writes the paragraph break, so a
policy that waits for the model to end a thought would never see one; with ``thought_splitter`` the
script leaves the position after each break to the model, which writes ``<|splitter|>`` there (trained as
a model-written token, like an answer). LightThinker then compresses each paragraph, break and splitter
included, into its cache tokens. The splitters do not count against ``trace_tokens`` and draw no
randomness, so the problems are those without splitters, one token per paragraph longer.

Methods: paragraphs (``"\\n\\n"``-separated) are ZoomR segments; a summary is lossy (the keys a
paragraph defined, never their values), so it points at the paragraph that holds a fact but cannot
replace it (SumR cannot answer); a 1,024-token trace spans 8-16 AbridgeKV blocks at C = 64-128 with
several facts each; filler carries nothing (a good KVzap surrogate evicts it); H2O loses facts that
have not been attended to yet.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from zoomr import tokens
from zoomr.schemas.checks import SettingsError, is_integer
from zoomr.schemas.testbed import TestbedData
from zoomr.testbed import vocab as tt

PROMPT_WORDS = [tt.PROMPT_WORD]


@dataclass
class Fact:
    index: int  # 1-based definition order
    key: int
    value: int
    paragraph: int
    definition_pos: int = -1  # response position of the value token
    topic: int | None = None  # the key word its paragraph opens with (paragraph_topics), named by its queries


@dataclass
class Query:
    fact: Fact
    paragraph: int  # paragraph that asks it; 0 = the final \boxed{} answer
    answer_pos: int = -1  # response position of the answer value token
    cue_pos: int = -1  # response position of the cue's last token (the boundary ":"; the key when inline)
    cue_first: int = -1  # response position of the cue's first token after "?" (the topic, else the key)

    @property
    def distance(self) -> int:
        """Tokens from the definition's value to the answer (how far back the fact is)."""
        return self.answer_pos - self.fact.definition_pos


@dataclass
class Problem:
    response_words: list[str]
    model_writes: list[int]  # response positions the model writes (answers; summaries if configured)
    facts: list[Fact]
    queries: list[Query]  # in trace order; the final ones last
    n_paragraphs: int
    summaries: bool
    summary_spans: list[tuple[int, int]] = field(default_factory=list)  # per paragraph: summary content [start, end)
    query_form: str = "cue"
    prompt_words: list[str] = field(default_factory=lambda: list(PROMPT_WORDS))
    paragraph_topics: bool = False

    def record(self, problem_id: str) -> dict[str, Any]:
        """JSON-serialisable test record (what the grader and the evaluator's script builder read)."""
        final = [q for q in self.queries if q.paragraph == 0]
        return {
            "id": problem_id,
            "prompt": " ".join(self.prompt_words),
            "response": " ".join(self.response_words),
            "model_writes": list(self.model_writes),
            "messages": messages(self.prompt_words, self.response_words),
            "answer": " ".join(w for q in final for w in query_words(q.fact, self.query_form)),
            "queries": [
                {
                    "key": tt.key(q.fact.key),
                    "value": tt.value(q.fact.value),
                    "defined_in": q.fact.paragraph,
                    "asked_in": q.paragraph,
                    "final": q.paragraph == 0,
                    "answer_pos": q.answer_pos,
                    "cue_pos": q.cue_pos,
                    "cue_first": q.cue_first,
                    "distance": q.distance,
                }
                for q in self.queries
            ],
            "facts": [asdict(f) for f in self.facts],
            "n_paragraphs": self.n_paragraphs,
            "summaries": self.summaries,
            "summary_spans": [list(s) for s in self.summary_spans],
            "query_form": self.query_form,
            "paragraph_topics": self.paragraph_topics,
            "response_tokens": len(self.response_words),
            "prompt_tokens": len(self.prompt_words),
        }


def messages(prompt_words: list[str], response_words: list[str]) -> list[dict[str, str]]:
    return [
        {"role": "user", "content": " ".join(prompt_words)},
        {"role": "assistant", "content": " ".join(response_words)},
    ]


QUERY_FORMS = ("cue", "inline")


def query_words(fact: Fact, form: str = "cue") -> list[str]:
    """The words of one query and its answer: ``? k : = v`` (cue) or ``? k v`` (inline); with a paragraph
    topic ``t`` (``paragraph_topics``) the cue names it first: ``? t k : = v``."""
    topic = [] if fact.topic is None else [tt.key(fact.topic)]
    cue = [tt.QUERY, *topic, tt.key(fact.key)] + ([tt.QUERY_END, tt.ANSWER_MARK] if form == "cue" else [])
    return [*cue, tt.value(fact.value)]


def query_cost(form: str, topics: bool = False) -> int:
    return (5 if form == "cue" else 3) + topics


def paragraph_cost(
    n_facts: int, n_queries: int, n_filler: int, summaries: bool, form: str = "cue", topics: bool = False
) -> int:
    """Response tokens of one paragraph: its topic (``topics``), filler, 2 per fact, 5 (cue; 3 inline; +1 with
    topics) per query, the summary (delimiters and the keys, or the topic), break."""
    summary = 2 + (1 if topics else n_facts) if summaries else 0
    return topics + n_filler + 2 * n_facts + query_cost(form, topics) * n_queries + summary + 1


def _range(r: list[int], what: str) -> tuple[int, int]:
    if not isinstance(r, Sequence) or isinstance(r, str) or not all(is_integer(v) for v in r):  # benchmark.options are untyped:
        raise SettingsError(f"testbed.{what} must be [lo, hi] of ints, got {r!r}")  # 3.5 failed in randrange, 3 in len
    if len(r) != 2 or r[0] > r[1] or r[0] < 0:
        raise SettingsError(f"testbed.{what} must be [lo, hi] with 0 <= lo <= hi, got {list(r)}")
    return int(r[0]), int(r[1])


def validate(cfg: TestbedData) -> None:
    lo, hi = _range(cfg.facts_per_paragraph, "facts_per_paragraph")
    if lo < 1:
        raise SettingsError("testbed.facts_per_paragraph: every paragraph defines at least one fact")
    _range(cfg.queries_per_paragraph, "queries_per_paragraph")
    _range(cfg.filler_before, "filler_before")
    _range(cfg.filler_after, "filler_after")
    if cfg.final_queries < 1:
        raise SettingsError("testbed.final_queries must be >= 1")
    if not 1 <= cfg.n_keys <= tt.N_KEYS:
        raise SettingsError(f"testbed.n_keys must be in [1, {tt.N_KEYS}] (the tokenizer's keys), got {cfg.n_keys}")
    if cfg.query_form not in QUERY_FORMS:
        raise SettingsError(f"testbed.query_form must be one of {QUERY_FORMS}, got {cfg.query_form!r}")
    if cfg.model_writes_summaries and not cfg.summaries:
        raise SettingsError("testbed.model_writes_summaries needs testbed.summaries=true")
    if cfg.paragraph_topics and cfg.query_form != "cue":
        raise SettingsError("testbed.paragraph_topics needs testbed.query_form=cue (a query names the topic, then the key)")
    topics = cfg.paragraph_topics
    need = paragraph_cost(hi, 0, 0, cfg.summaries, topics=topics) + 2 + query_cost(cfg.query_form, topics) * cfg.final_queries
    if cfg.trace_tokens < need:
        raise SettingsError(f"testbed.trace_tokens={cfg.trace_tokens} is too short for one paragraph and the answer")


def _pick(rng: random.Random, eligible: list[Fact], bias: float) -> Fact:
    """One fact, weight (age rank + 1) ** bias (rank 0 = the newest eligible fact); bias 0 = uniform."""
    if bias == 0:
        return eligible[rng.randrange(len(eligible))]
    weights = [(len(eligible) - i) ** bias for i in range(len(eligible))]
    return rng.choices(eligible, weights=weights)[0]


CUE_READ_OFFSET = 2  # a cue query's value is predicted from the token 2 after its key ("k : =")


def crosses_block(first: int, last: int, period: int) -> bool:
    """Response positions ``first`` and ``last`` lie in different blocks of a ``period``-token grid (0, C, 2C, …):
    a fact whose key and value do straddles a boundary (``first`` = key, ``last`` = value), and so does a cue
    query whose key and the token predicting its value do (``last`` = key + :data:`CUE_READ_OFFSET`)."""
    return first // period != last // period


def _straddle_fillers(
    cfg: TestbedData, rng: random.Random, start: int, n_facts: int, n_queries: int, before: int, after: int
) -> tuple[int, int]:
    """Filler lengths (within their ranges) that put one of the paragraph's facts or queries across a block
    boundary (``boundary_period``): a fact's key on a block's last token, so its value opens the next block; a
    cue query's key on one of a block's last two tokens, so the value is predicted from the next block. The item
    is drawn uniformly among those that can straddle, then its filler lengths; none can: ``(before, after)``."""
    period = cfg.boundary_period
    b_range = range(cfg.filler_before[0], cfg.filler_before[1] + 1)
    a_range = range(cfg.filler_after[0], cfg.filler_after[1] + 1)
    choices = []
    for j in range(n_facts):  # key at start + b + 2j, its value next
        key = start + 2 * j
        fits = [(b, after) for b in b_range if crosses_block(key + b, key + b + 1, period)]
        choices += [fits] if fits else []
    if cfg.query_form == "cue":  # key at start + b + 2·n_facts + a + (1 + topic) + cost·i
        first_key = start + 2 * n_facts + 1 + cfg.paragraph_topics
        for i in range(n_queries):
            key = first_key + query_cost(cfg.query_form, cfg.paragraph_topics) * i
            fits = [(b, a) for b in b_range for a in a_range
                    if crosses_block(key + b + a, key + b + a + CUE_READ_OFFSET, period)]  # fmt: skip
            choices += [fits] if fits else []
    if not choices:
        return before, after
    fits = choices[rng.randrange(len(choices))]
    return fits[rng.randrange(len(fits))]


class _Writer:
    """Accumulates response words and remembers which positions the model writes."""

    def __init__(self) -> None:
        self.words: list[str] = []
        self.model_writes: list[int] = []

    def env(self, *words: str) -> None:
        self.words += words

    def model(self, word: str) -> int:
        self.model_writes.append(len(self.words))
        self.words.append(word)
        return len(self.words) - 1


def generate(cfg: TestbedData, rng: random.Random) -> Problem:
    """One problem. All randomness comes from ``rng``; the result depends on nothing else."""
    validate(cfg)
    keys = rng.sample(range(cfg.n_keys), cfg.n_keys)
    topics = cfg.paragraph_topics
    reserve = 2 + query_cost(cfg.query_form, topics) * cfg.final_queries  # \boxed{ ? k : = v … }
    w = _Writer()
    facts: list[Fact] = []
    queries: list[Query] = []
    unqueried: list[Fact] = []  # facts of earlier paragraphs not yet queried, oldest first
    n_paragraphs = 0
    spans: list[tuple[int, int]] = []
    splitters = 0  # LightThinker thought ends written so far (thought_splitter)

    def answer(q: Query) -> None:
        *cue, value = query_words(q.fact, cfg.query_form)
        q.cue_first = len(w.words) + 1
        w.env(*cue)
        q.cue_pos = len(w.words) - (2 if cfg.query_form == "cue" else 1)
        q.answer_pos = w.model(value)
        queries.append(q)

    while True:
        n_facts = rng.randint(*cfg.facts_per_paragraph)
        n_queries = min(rng.randint(*cfg.queries_per_paragraph), len(unqueried))
        before, after = rng.randint(*cfg.filler_before), rng.randint(*cfg.filler_after)
        if cfg.boundary_rate > 0 and rng.random() < cfg.boundary_rate:
            start = len(w.words) + topics  # the paragraph's first filler word
            before, after = _straddle_fillers(cfg, rng, start, n_facts, n_queries, before, after)
        cost = paragraph_cost(n_facts, n_queries, before + after, cfg.summaries, cfg.query_form, topics)
        if len(w.words) - splitters + cost + reserve > cfg.trace_tokens:  # splitters do not count
            break
        if len(facts) + n_facts + (n_paragraphs + 1 if topics else 0) > cfg.n_keys:
            raise SettingsError(  # a rule from the settings alone would refuse lengths that never run out in practice
                f"testbed.trace_tokens={cfg.trace_tokens} needs more than n_keys={cfg.n_keys} facts"
                f"{' and topics' if topics else ''}: raise testbed.n_keys or lengthen the filler"
            )
        n_paragraphs += 1
        topic = keys[cfg.n_keys - n_paragraphs] if topics else None  # from the end: never a fact's key
        asked = []
        for _ in range(n_queries):
            fact = _pick(rng, unqueried, cfg.query_age_bias)
            unqueried.remove(fact)
            asked.append(Query(fact, n_paragraphs))
        if topic is not None:
            w.env(tt.key(topic))
        w.env(*(tt.filler(rng.randrange(tt.N_FILLER)) for _ in range(before)))
        new = []
        for _ in range(n_facts):
            fact = Fact(len(facts) + 1, keys[len(facts)], rng.randrange(tt.N_VALUES), n_paragraphs, topic=topic)
            w.env(tt.key(fact.key), tt.value(fact.value))
            fact.definition_pos = len(w.words) - 1
            facts.append(fact)
            new.append(fact)
        w.env(*(tt.filler(rng.randrange(tt.N_FILLER)) for _ in range(after)))
        for q in asked:
            answer(q)
        if cfg.summaries:
            w.env(tokens.BEGIN_SUMMARY)
            content = [tt.key(topic)] if topic is not None else [tt.key(f.key) for f in new]
            spans.append((len(w.words), len(w.words) + len(content)))
            for word in content:
                (w.model if cfg.model_writes_summaries else w.env)(word)
            (w.model if cfg.model_writes_summaries else w.env)(tokens.END_SUMMARY)
        w.env(tt.BREAK)
        if cfg.thought_splitter:
            w.model(tokens.SPLITTER)
            splitters += 1
        unqueried += new
    if n_paragraphs == 0:
        raise ValueError(f"testbed.trace_tokens={cfg.trace_tokens}: not even one paragraph fits")
    w.env(tt.BOXED)
    for f in sorted(unqueried, key=lambda f: f.index)[: cfg.final_queries]:
        answer(Query(f, 0))
    w.env(tt.CLOSE)
    return Problem(w.words, w.model_writes, facts, queries, n_paragraphs, cfg.summaries, spans, cfg.query_form,
                   paragraph_topics=topics)  # fmt: skip


def problems(cfg: TestbedData, n: int, seed: int, start: int = 0) -> list[Problem]:
    """``n`` problems; problem ``i`` uses its own generator seeded by (seed, i), so any prefix is stable."""
    return [problem(cfg, seed, i) for i in range(start, start + n)]


def problem(cfg: TestbedData, seed: int, i: int) -> Problem:
    """Problem ``i`` of the stream ``seed`` (its own generator, seeded by (seed, i))."""
    return generate(cfg, random.Random(f"testbed/{seed}/{i}"))


def sft_dataset(data: dict[str, Any], tokenizer=None):
    """``datasets.Dataset`` of chat ``messages`` (the ``data.loader`` protocol of ``+method=sft``).

    The generic TRL path puts the loss on the whole response (environment tokens included);
    ``+method=sft_testbed`` is the recipe that trains on the model-written positions only.
    """
    import datasets

    cfg = TestbedData(**data)
    rows = [
        {"messages": messages(p.prompt_words, p.response_words), "id": f"testbed-train-{cfg.seed}-{i}"}
        for i, p in enumerate(problems(cfg, cfg.n_train, cfg.seed))
    ]
    return datasets.Dataset.from_list(rows)


class TokenExamples:
    """Training problems as ``(prompt ids, response ids, loss positions)``, generated on access (the
    ``token_examples`` protocol of the block-masked trainers, :func:`zoomr.abridge.trainer.load_streams`).

    Problem ``i`` is problem ``i`` of :func:`problems` at the data's seed, so nothing is materialised and any
    index is reproducible. Loss positions are the response positions the model writes (answers; summaries
    when ``model_writes_summaries``), never the environment's random tokens.
    """

    def __init__(self, data: dict[str, Any], tokenizer) -> None:
        self.cfg = TestbedData(**data)
        validate(self.cfg)
        self.enc = tt.FastEncoder(tokenizer)

    def __len__(self) -> int:
        return self.cfg.n_train

    def __getitem__(self, i: int) -> tuple[list[int], list[int], list[int]]:
        if not 0 <= i < len(self):
            raise IndexError(i)
        p = problem(self.cfg, self.cfg.seed, i)
        ids, start = self.enc.chat(p.prompt_words, p.response_words)
        return ids[:start], ids[start:], list(p.model_writes)


def token_examples(data: dict[str, Any], tokenizer) -> TokenExamples:
    return TokenExamples(data, tokenizer)

