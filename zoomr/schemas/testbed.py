"""Schemas of the synthetic recall testbed (``data=testbed``) and its trainer (``+method=sft_testbed``).

The task and its no-shortcut argument are documented in :mod:`zoomr.testbed.task`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zoomr.schemas.checks import (
    AT_LEAST_ONE,
    BETA,
    FINITE,
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    check_fields,
    check_types,
)
from zoomr.schemas.sft import check_length


@dataclass
class TestbedData:
    """One testbed task distribution (a generator config, not a file).

    Lengths are counted in tokens of the testbed word-level tokenizer (one word = one token).
    ``[lo, hi]`` ranges are inclusive and drawn uniformly per paragraph.
    """

    __test__ = False  # not a pytest class despite the name

    name: str = "testbed"
    loader: str = "zoomr.testbed.task"  # module with sft_dataset(data, tokenizer) -> datasets.Dataset
    trace_tokens: int = 1024  # upper bound on the response length (the reasoning trace + final answer)
    n_keys: int = 256  # keys drawn from the first n_keys of the tokenizer's (MQAR difficulty grows with it)
    facts_per_paragraph: list[int] = field(default_factory=lambda: [3, 4])
    queries_per_paragraph: list[int] = field(default_factory=lambda: [1, 3])  # about earlier paragraphs
    filler_before: list[int] = field(default_factory=lambda: [8, 32])  # filler words before the facts
    filler_after: list[int] = field(default_factory=lambda: [0, 8])  # between the facts and the queries
    final_queries: int = 8  # the \boxed{} answer recalls the earliest facts still unqueried
    # cue (issue 13): "? k : = v" — the cue names the key, the boundary ":" follows it, the value comes
    # one step later, so ZoomR's selection at ":" applies when the value is predicted (a real trace says
    # "recall the value of x: …"). The 3-layer tiny-testbed learns it (teacher-forced 1.000; greedy full KV
    # 0.988 / 0.996 on two held-out seeds); a 2-layer model does not (0.16). inline: the older "? k v".
    query_form: str = "cue"
    query_age_bias: float = 0.0  # a query picks an eligible fact with weight (age rank + 1) ** bias; 0 = uniform
    summaries: bool = False  # insert <|begin_of_summary|> keys… <|end_of_summary|> after each paragraph
    model_writes_summaries: bool = False  # the model (not the environment) writes each summary's keys
    # Paragraph topics (issue 13, a format variant): each paragraph opens with a topic word (a key word no fact
    # of the problem uses), its summary is that word alone, and a query names the topic before the key
    # ("? t k : = v": "recall, from the paragraph about t, the value of k"). A summary's tokens are then all
    # about one thing, as a real summary's are; with the keys form, ZoomR's mean summary key averages 3-4
    # unrelated keys (analysis/results/zoomr_testbed/HISTORY.md, attempt 9 m).
    paragraph_topics: bool = False
    # LightThinker's thought end (issue 14): after each paragraph break the environment leaves one position to
    # the model, which writes <|splitter|> there (a model-written token, trained with loss). Not counted in
    # trace_tokens, so the problems (facts, filler, queries) are exactly those without splitters.
    thought_splitter: bool = False
    # Block-boundary training data (a training-data variant for block compressors, 2026-12-04): with probability
    # boundary_rate a paragraph chooses its filler lengths (within their ranges) so that one of its facts or
    # queries straddles a boundary of a boundary_period-token block grid (response positions 0, C, 2C, …): a
    # fact's key on a block's last token, or a query's key on its last or second-to-last. For training streams;
    # the miniature's test problems never use it. At C = 128 ~2% of plain queries straddle; an AbridgeKV model
    # trained on plain traces missed ~93% of them and 1 other in 6,419 (README, miniature). 0 = off (then no
    # random draw changes: the problems are those of the default stream).
    boundary_period: int = 0
    boundary_rate: float = 0.0
    seed: int = 0  # training stream seed
    n_train: int = 2000  # examples materialised by sft_dataset (the generic TRL path)
    n_test: int = 256  # test problems (load_test_problems)
    test_seed: int = 1_000_003  # test problems are drawn from a seed stream disjoint from training

    def __post_init__(self) -> None:
        check_types(self, "data")  # given as benchmark.options (an untyped dict) too: test_seed=1.5 drew a stream
        check_fields(
            self, "data", boundary_period=NON_NEGATIVE, boundary_rate=FRACTION, n_train=AT_LEAST_ONE, n_test=AT_LEAST_ONE,
            query_age_bias=FINITE,
        )
        if self.boundary_rate > 0 and self.boundary_period < 2:
            raise ValueError(
                f"data.boundary_rate={self.boundary_rate} needs data.boundary_period >= 2 (the block size C to "
                f"straddle), got {self.boundary_period}"
            )
        if self.test_seed == self.seed:  # problem i of a stream is the same problem wherever it is drawn
            raise ValueError(
                f"data.test_seed={self.test_seed} is the training stream's seed (data.seed): the test problems "
                "would be training problems; test seeds are 1000003 and up"
            )


@dataclass
class CurriculumSettings:
    """Trace length grows geometrically from ``start_tokens`` to the data's ``trace_tokens``."""

    start_tokens: int = 64
    grow_fraction: float = 0.5  # fraction of the step budget over which the maximum length grows
    full_length_fraction: float = 0.5  # after growth, this fraction of batches use the full length
    filler_full_at: int = 512  # filler ranges scale linearly from 0 at start_tokens to full at this length
    copy_steps: int = 600  # first steps: every batch is the copy task (forms induction heads), then traces
    copy_warmup_fraction: float = 0.0  # then, for this fraction of the remaining steps, every other batch copies
    recall_steps: int = 150  # then bare associative recall (facts, then queries), then the trace curriculum
    recall_facts: list[int] = field(default_factory=lambda: [4, 32])  # facts per recall row
    copy_tokens_per_step: int = 4096  # copy and recall batches are short: this many tokens each
    copy_block: list[int] = field(default_factory=lambda: [8, 64])

    def __post_init__(self) -> None:
        check_fields(self, "method.curriculum", start_tokens=AT_LEAST_ONE, grow_fraction=FRACTION,
                     full_length_fraction=FRACTION, filler_full_at=AT_LEAST_ONE, copy_steps=NON_NEGATIVE,
                     copy_warmup_fraction=FRACTION, recall_steps=NON_NEGATIVE, recall_facts=AT_LEAST_ONE,
                     copy_tokens_per_step=AT_LEAST_ONE, copy_block=AT_LEAST_ONE)  # fmt: skip
        for name in ("recall_facts", "copy_block"):
            lo_hi = getattr(self, name)
            if len(lo_hi) != 2 or lo_hi[0] > lo_hi[1]:
                raise ValueError(f"method.curriculum.{name}={lo_hi!r}: must be a range [low, high] with low <= high")


LINEAR_INITS = ("torch", "hub")  # train/testbed_pretrain.init_weights


@dataclass
class TestbedTrainMethod:
    """From-scratch full training on freshly generated testbed traces (plain PyTorch loop).

    Loss on the positions the model writes at evaluation (answers; summaries if the data says so), never
    on the environment's random tokens.
    """

    name: str = "sft_testbed"
    trainer: str = "testbed_pretrain"
    max_steps: int = 2550
    max_seconds: float = 0.0  # >0: stop (and save) once this much wall time has passed
    tokens_per_step: int = 8192
    learning_rate: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    weight_decay: float = 0.1  # matrices only; never embeddings or norms
    max_grad_norm: float = 1.0
    embedding_init_std: float = 0.02
    linear_init: str = "torch"  # torch (Kaiming-uniform, the recipe's) | hub (keep the config's N(0, initializer_range))
    curriculum: CurriculumSettings = field(default_factory=CurriculumSettings)
    # Summary pointer (issue 13; data with summaries only): an auxiliary cross-entropy at every query's
    # boundary ":" that makes ZoomR's score q · k̄_i (post-RoPE, mean over the summary's content keys)
    # pick the summary of the paragraph that defined the queried fact, per layer and query head. Weight
    # 1.0 = one pointer CE per cue beside one answer CE per query (the two losses are of the same size).
    # Layers: None = every layer but the first (layer 0's query at ":" sees only ":" and its position, it
    # cannot know the key, so no loss can make it point).
    summary_pointer_weight: float = 1.0
    summary_pointer_layers: list[int] | None = None
    # A variant: None = the cross-entropy above; a number = a hinge with this margin (in units of the scaled
    # score q · k̄ / sqrt(d)) between the target and its strongest competitor, per query head and cue.
    summary_pointer_margin: float | None = None
    # Weight of zoomr.summary_pointer.key_spread_penalty (mean squared cosine between the centred input
    # embeddings of distinct keys), a testbed-model device against crosstalk in q · k̄; 0 = off
    key_spread_weight: float = 0.0
    # Weight of zoomr.summary_pointer.value_read_loss (the "=" row's attention on the queried value's row, a
    # mixture over the pointer layers' heads), a testbed-model device for the cue-view stage; 0 = off
    value_read_weight: float = 0.0
    # Also put the pointer loss on each cue's key token (the token before ":"; query_form=cue only). A
    # training device, not a change of ZoomR's rule (which scores with the boundary's query): the key's own
    # query can match the summary's keys in one step, and the boundary's query then reuses that matching
    # once layer 0 copies the key into ":" (trained alone at ":", the heads settle on a recency prior).
    summary_pointer_at_key: bool = False
    # ZoomR's view at the cue (zoomr.testbed.cue_view): each cue's key and ":" rows attend only to the prompt
    # and the last this-many rows, what they are sure to see under ZoomR decoding (where the selection made
    # at ":" applies from "=" on), so the model reads the value at "=" from the zoomed-in paragraph and its
    # ":" query points from the key itself, not by attending to the summary.
    # A training device for the testbed (data with summaries, query_form=cue); None = plain causal attention.
    cue_view_window: int | None = None
    # From this step on, they also see what the selection made at the cue's "?" keeps (I_c's paragraphs, I_s's
    # summaries), from the model's own votes in a gradient-free forward first (+1 forward per step): decoding's
    # extra context. None = never. Start it once the value is read at "=" (with it from step 0, a model that
    # reads at the key keeps doing so whenever "?" happened to zoom into the paragraph: measured, no change in
    # 400 steps, where the plain view moved the reading to "=" in ~300)
    cue_view_previous_selection_from: int | None = None
    # A checkpoint to continue from (weights only, fresh optimizer and schedule): a second training stage,
    # e.g. the pointer stage of the ZoomR miniature; None trains from scratch
    init_from: str | None = None
    # A variant, not the miniature's recipe: forward and losses under torch.autocast(bfloat16) (the weights, the
    # optimizer and the backward's accumulation stay float32). 1.32x per step on this CPU (analysis/results/
    # bench_train_step/); what it does to a trained model: analysis/results/miniature/base_bf16/
    autocast_bf16: bool = False
    eval_every: int = 100  # teacher-forced answer accuracy on held-out full-length traces
    eval_examples: int = 16
    save_every: int = 200  # checkpoint (model + optimizer + step) for resume
    log_every: int = 10
    threads: int = 0  # torch threads; 0 = leave as set by OMP_NUM_THREADS

    def __post_init__(self) -> None:
        check_length(type(self).__name__, self.max_steps)
        check_fields(self, "method", max_seconds=NON_NEGATIVE, tokens_per_step=AT_LEAST_ONE, learning_rate=POSITIVE,
                     min_lr_ratio=FRACTION, warmup_steps=NON_NEGATIVE, betas=BETA, weight_decay=NON_NEGATIVE,
                     max_grad_norm=POSITIVE, embedding_init_std=POSITIVE, summary_pointer_weight=NON_NEGATIVE,
                     summary_pointer_margin=POSITIVE, key_spread_weight=NON_NEGATIVE, value_read_weight=NON_NEGATIVE,
                     cue_view_window=NON_NEGATIVE, cue_view_previous_selection_from=NON_NEGATIVE,
                     eval_every=AT_LEAST_ONE, eval_examples=AT_LEAST_ONE, save_every=AT_LEAST_ONE,
                     log_every=AT_LEAST_ONE, threads=NON_NEGATIVE)  # fmt: skip
        if len(self.betas) != 2:
            raise ValueError(f"method.betas={self.betas!r}: AdamW takes two betas")
        if self.linear_init not in LINEAR_INITS:  # any other word kept the config's init, without a word
            raise ValueError(f"method.linear_init must be {'|'.join(LINEAR_INITS)}, got {self.linear_init!r}")


SCHEMAS = [("data", "testbed", TestbedData), ("method", "sft_testbed", TestbedTrainMethod)]
