"""Schemas of the synthetic recall testbed (``data=testbed``) and its trainer (``+method=sft_testbed``).

The task and its no-shortcut argument are documented in :mod:`data_prep.testbed`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TestbedData:
    """One testbed task distribution (a generator config, not a file).

    Lengths are counted in tokens of the testbed word-level tokenizer (one word = one token).
    ``[lo, hi]`` ranges are inclusive and drawn uniformly per paragraph.
    """

    __test__ = False  # not a pytest class despite the name

    name: str = "testbed"
    loader: str = "data_prep.testbed"  # module with sft_dataset(data, tokenizer) -> datasets.Dataset
    trace_tokens: int = 1024  # upper bound on the response length (the reasoning trace + final answer)
    facts_per_paragraph: list[int] = field(default_factory=lambda: [2, 4])
    queries_per_paragraph: list[int] = field(default_factory=lambda: [0, 3])
    filler: list[int] = field(default_factory=lambda: [12, 40])  # countdown filler at each paragraph's end
    final_queries: int = 8  # the \boxed{} answer recalls the earliest facts still unqueried
    query_age_bias: float = 0.0  # a query picks an eligible fact with weight (age rank + 1) ** bias; 0 = uniform
    summaries: bool = False  # insert <|begin_of_summary|> P_i keys… <|end_of_summary|> after each paragraph
    seed: int = 0  # training stream seed
    n_train: int = 2000  # examples materialised by sft_dataset (the generic TRL path)
    n_test: int = 256  # test problems (load_test_problems)
    test_seed: int = 1_000_003  # test problems are drawn from a seed stream disjoint from training


@dataclass
class CurriculumSettings:
    """Trace length grows geometrically from ``start_tokens`` to the data's ``trace_tokens``."""

    start_tokens: int = 64
    grow_fraction: float = 0.5  # fraction of the step budget over which the maximum length grows
    full_length_fraction: float = 0.5  # after growth, this fraction of batches use the full length
    filler_full_at: int = 512  # filler range scales linearly from 0 at start_tokens to full at this length
    copy_warmup_fraction: float = 0.15  # first fraction of steps: every other step is a copy task
    copy_block: list[int] = field(default_factory=lambda: [8, 64])


@dataclass
class TestbedTrainMethod:
    """From-scratch full training on freshly generated testbed traces (plain PyTorch loop).

    Loss on every response token (the whole trace is a deterministic function of the prompt, and the
    model generates all of it at evaluation); answer tokens can be up-weighted.
    """

    name: str = "sft_testbed"
    trainer: str = "testbed_pretrain"
    max_steps: int = 1200
    max_seconds: float = 0.0  # >0: stop (and save) once this much wall time has passed
    tokens_per_step: int = 8192
    learning_rate: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    weight_decay: float = 0.1  # matrices only; never embeddings or norms
    max_grad_norm: float = 1.0
    embedding_init_std: float = 0.02
    answer_loss_weight: float = 1.0  # weight of query-answer tokens relative to other response tokens
    curriculum: CurriculumSettings = field(default_factory=CurriculumSettings)
    eval_every: int = 100  # teacher-forced answer accuracy on held-out full-length traces
    eval_examples: int = 16
    save_every: int = 200  # checkpoint (model + optimizer + step) for resume
    log_every: int = 10
    threads: int = 0  # torch threads; 0 = leave as set by OMP_NUM_THREADS


SCHEMAS = [("data", "testbed", TestbedData), ("method", "sft_testbed", TestbedTrainMethod)]
