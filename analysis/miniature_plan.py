"""What the miniature reproduction trains and evaluates (issue 15): models and arms as plain data.

A :class:`Model` is one ``python -m train`` command (its run lands in ``runs/train/<run_name>``, resumable);
``{name}`` in its overrides is replaced by the ``final/`` checkpoint of the model ``name`` it starts from.
An :class:`Arm` is one ``python -m eval benchmark=testbed`` command on a model's checkpoint with a cache
policy; ``match`` gives it the measured mean resident rows of another arm (``method.budget_match``, the
papers' matched-memory comparison), times ``match_scale``. ``method`` is the policy name as in
``conf/method/`` (what ``results.json`` reports); the arm named exactly as its method runs the paper's
defaults. Testbed-specific settings (block size, window) are written out here, each with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zoomr.schemas.checks import SettingsError

# AbridgeKV on the testbed: blocks of C = 256 response tokens, K = 64 pause tokens (code rows) per block; a layer
# keeping q of them compresses a completed block C:q (q = 64: 4:1, q = 32: 8:1; per-layer: the allocation's
# schedule, K = 2 x 64). C = 256 is the main block size since 2026-12-05 (block256/): with the same recipe and ratio
# its per-layer model is within 2 points of full KV on all six test seeds (pooled +0.2 [-0.4, +0.9]), where C = 128's
# is -1.1 [-2.0, -0.2] pooled and -2.3 on one: at C = 256 a trace has half the block boundaries, and the facts that
# straddle one are what the per-layer model misses. The price is the open block (up to 256 raw rows): 0.444 of full
# KV's rows against 0.351 at C = 128 and 0.305 at C = 64. Earlier main block sizes are variant families: C = 128
# (2026-12-04/05, abridge_c128*; block128/) and C = 64 (BLOCK, PAUSES: abridge_c64*). At C = 64 the per-layer model's
# accuracy came with a held-out CE drop late in its 5,000 steps and at a step that varied between trainings (0.973,
# then 0.828: rerun_perlayer/); at C = 128 a block's code rows serve ~2x the facts and half as many facts straddle a
# boundary (MINIATURE_NOTES). The paper's C = 512 (4:1 with q = 128) would leave a 1,024-token trace one completed block.
BLOCK, PAUSES = 64, 16
ABRIDGE_STEPS = 3000  # the C = 64 models' first stage
KVZAP_THRESHOLDS = (-8.0, -7.0, -6.0, -5.75, -5.5, -5.0, -4.0)  # log-score thresholds τ (README, KVzap on the testbed);
# -5.75 refines the grid where compression crosses 50% (between -6 and -5.5 on the validation seed 1,000,003)
SECOND_STAGE = ("method.optim.learning_rate=5e-4", "data.seed=1")  # AbridgeKV's second stage: half the peak LR, fresh problems
THIRD_STAGE = ("method.optim.learning_rate=5e-4", "data.seed=2")  # the per-layer model's third: other fresh problems
BLOCK_128, PAUSES_128, BLOCK_128_STEPS = 128, 32, 1500  # the C = 128 variant; every family's stage steps
# the per-layer model's second stage trains on block-boundary data (data.boundary_rate, 2026-12-04,
# block128/README), its third on plain problems again. After two plain stages it missed ~93% of the facts and queries
# that straddle a block boundary (a fact's key on a block's last token; a query's key on its last two) and 1 in 6,419
# other queries: every answer it got wrong on the validation seed had a straddling final fact. Rate 1.0 (~6x the
# natural straddles) taught them within ~500 steps; rate 0.3 did only in part (0.4 of the query straddles still
# missed). But rate 1.0 starves the value positions next to a boundary (a value on a block's last token: none), which
# the model then missed; the plain third stage brings them back (chosen on the validation seed 1,000,003: straddles
# missed 6 / 123, others 4 / 6,503); _abridge_family
BLOCK_256, PAUSES_256 = 256, 64  # the main family (models abridge_c256_*, arms abridge*)
ZOOMR_WINDOW = 64  # N_w: the paper's 512 is half a 1,024-token testbed trace; 64 ~ one paragraph
# the ZoomR testbed model's architecture (issue 13, attempt 8): the tiny-testbed size as a phi3 with partial RoPE. With
# RoPE on every dim (llama) the teacher-forced pointer plateaued at 0.93-0.95 and ZoomR at 0.71 (seed 2,000,003)
ZOOMR_ARCH = ("model.arch=phi3", "+model.tiny.partial_rotary_factor=0.5")
ZOOMR_CUE_STEPS = 1200  # the cue-view stage of the ZoomR model (full-length traces only, no warm-up tasks)
ZOOMR_CUE_PLAIN_STEPS = 400  # its first steps under the plain cue view (the reading moves to "=" in ~300)
# the ZoomR testbed's traces (issue 13, attempt 9 m): a summary after every paragraph, written by the model, and
# paragraph topics: a summary is its paragraph's topic word and a query names it ("? t k : = v"), so ZoomR's mean
# summary key is one word's key (with the keys form it averaged 3-4 unrelated keys: misses 2-3% of cues)
SUMMARIES_DATA = ("data=testbed_summaries", "data.model_writes_summaries=true", "data.paragraph_topics=true")


@dataclass(frozen=True)
class Model:
    """A step that produces what arms need: by default a ``python -m train`` run whose ``final/`` is a
    checkpoint; ``entry``/``done`` for other steps (KVzap's pairs and surrogates), ``serves`` the model whose
    checkpoint the arms load (KVzap serves the base model with its surrogates)."""

    name: str
    overrides: tuple[str, ...]
    needs: tuple[str, ...] = ()
    summaries: bool = False  # trained on traces with a summary after every paragraph (written by the model)
    entry: str = "train"
    done: str | None = None  # a file whose existence marks the step finished; default: <run dir>/summary.json
    serves: str | None = None

    def run_name(self, trace_tokens: int) -> str:
        return f"mini-{self.name}-T{trace_tokens}"


@dataclass(frozen=True)
class Arm:
    name: str
    method: str  # policy name as in conf/method/ (``full`` for no policy)
    model: str
    overrides: tuple[str, ...] = ()  # after +method=<method yaml>
    method_yaml: str | None = None  # conf/method/<yaml>; default: ``method`` (None for full KV)
    match: str | None = None  # arm whose mean resident rows this arm gets
    match_scale: float = 1.0
    extra: dict = field(default_factory=dict)  # fields copied into results.json (ratio, threshold, ...)
    default: bool = True  # run by ``task.arms=[]``; False: a variant whose models cost extra training, run when named

    @property
    def yaml(self) -> str | None:
        return self.method_yaml or (None if self.method == "full" else self.method)


def _abridge(quota: int | None, steps: int = ABRIDGE_STEPS, extra: tuple[str, ...] = (), start: str = "base",
             pauses: int = PAUSES, block: int = BLOCK) -> tuple[str, ...]:
    return (
        "+method=abridge", "data=testbed", "model=tiny-testbed", f"method.init_from={{{start}}}",
        f"method.block_size={block}", f"method.num_pause={pauses}", f"method.quota={'null' if quota is None else quota}",
        f"method.max_steps={steps}", "method.eval_steps=500", "method.save_steps=250", "method.logging_steps=50",
        "data.n_train=20000", *extra,
    )  # fmt: skip


def _allocate(uniform: str) -> tuple[str, ...]:
    """abridge_allocate on the uniform model ``uniform`` (held-out CE on 32 training-stream problems)."""
    return ("+method=abridge_allocate", "data=testbed", "model=tiny-testbed", f"method.checkpoint={{{uniform}}}",
            "method.heldout_examples=32")  # fmt: skip


def _schedule(alloc: str) -> str:
    """The override that trains on the schedule written by the allocation model ``alloc``."""
    return f"method.schedule=runs/train/{{{alloc}_name}}/schedule.json"


def _abridge_family(block: int, pauses: int, pauses_8to1: int | None = None) -> list[Model]:
    """AbridgeKV at block size ``block`` with ``pauses`` code rows per block (4:1 at q = pauses): uniform 4:1 and 8:1,
    the allocation on the 4:1 model, and the per-layer model on its schedule (K = 2 x pauses) in three stages of
    BLOCK_128_STEPS: plain; SECOND_STAGE on block-boundary data (period ``block``); THIRD_STAGE plain. The
    boundary stage's steps grow with ``block`` so that it sees as many straddles as at C = 128 (a trace has half
    as many boundaries at C = 256; in 1,500 steps its loss had only begun to fall: block256/). The uniform 4:1 model
    keeps every one of its K = q pause rows; 8:1 keeps q / 2 of ``pauses_8to1`` (default ``pauses``: half of the 4:1
    model's K, as the C = 64 and C = 128 families were trained; ``pauses // 2``: all of them, K = q as at 4:1)."""
    c = f"abridge_c{block}"
    stage = dict(steps=BLOCK_128_STEPS, pauses=2 * pauses, block=block)
    boundary_stage = {**stage, "steps": BLOCK_128_STEPS * block // BLOCK_128}
    perlayer = (_schedule(f"{c}_alloc"),)
    boundary = (f"data.boundary_period={block}", "data.boundary_rate=1.0")
    return [
        Model(f"{c}_4to1", _abridge(pauses, steps=BLOCK_128_STEPS, pauses=pauses, block=block), needs=("base",)),
        Model(f"{c}_8to1", _abridge(pauses // 2, steps=BLOCK_128_STEPS, pauses=pauses_8to1 or pauses, block=block),
              needs=("base",)),
        Model(f"{c}_alloc", _allocate(f"{c}_4to1"), needs=(f"{c}_4to1",)),
        Model(f"{c}_perlayer", _abridge(None, extra=perlayer, **stage), needs=("base", f"{c}_alloc")),
        Model(f"{c}_perlayer_boundary",
              _abridge(None, start=f"{c}_perlayer", extra=(*perlayer, *SECOND_STAGE, *boundary), **boundary_stage),
              needs=(f"{c}_perlayer", f"{c}_alloc")),
        Model(f"{c}_perlayer_more", _abridge(None, start=f"{c}_perlayer_boundary", extra=(*perlayer, *THIRD_STAGE), **stage),
              needs=(f"{c}_perlayer_boundary", f"{c}_alloc")),
    ]


MODELS: dict[str, Model] = {
    m.name: m
    for m in [
        Model("base", ("+method=sft_testbed", "data=testbed", "model=tiny-testbed")),
        # the summary-pointer loss at each cue's boundary and its key token (issue 13; the policy's rule is unchanged),
        # on the tiny-testbed size with RoPE on half of each head's dims (phi3, ZOOMR_ARCH): the other half is free of
        # position, so q · k̄ can match a key however far back its summary lies
        Model(
            "base_sum",
            ("+method=sft_testbed", *SUMMARIES_DATA, "model=tiny-testbed", *ZOOMR_ARCH, "method.summary_pointer_at_key=true"),
            summaries=True,
        ),
        # ZoomR's decoding-time view at each cue (issue 13, zoomr.testbed.cue_view): a second stage in which the
        # cue's key and ":" rows see only the prompt and the window, then also what the selection at "?" keeps (the
        # model's own votes), so the value is read at "=" from the zoomed-in paragraph and ":" points from the key
        Model(
            "base_sum_cue",
            ("+method=sft_testbed", *SUMMARIES_DATA, "model=tiny-testbed", *ZOOMR_ARCH, "method.summary_pointer_at_key=true",
             "method.init_from={base_sum}", f"method.cue_view_window={ZOOMR_WINDOW}",
             f"method.cue_view_previous_selection_from={ZOOMR_CUE_PLAIN_STEPS}", f"method.max_steps={ZOOMR_CUE_STEPS}",
             "method.learning_rate=1e-3",
             "method.warmup_steps=50", "method.curriculum.copy_steps=0", "method.curriculum.recall_steps=0",
             "method.curriculum.grow_fraction=0"),
            needs=("base_sum",), summaries=True,
        ),  # fmt: skip
        # AbridgeKV at C = 256 (BLOCK_256, the main family): uniform 4:1 and 8:1, the allocation on the 4:1 model, the
        # per-layer model on its schedule in three stages (plain; at half the peak LR on fresh problems with
        # block-boundary data at period 256, for twice BLOCK_128_STEPS; plain again on other fresh problems). Both
        # uniform models keep every pause row they run (K = q: 64 and 32): on the validation seed K = q beat K = 2q
        # at 4:1 (0.795 vs 0.596 / 0.617, two trainings); at 8:1 two trainings of each rule spread over 0.045-0.129
        # pooled, so 8:1 follows 4:1's rule for consistency (block256/, "K = q or K = 2q")
        *_abridge_family(BLOCK_256, PAUSES_256, pauses_8to1=PAUSES_256 // 2),
        # the C = 128 variant family (opt-in arms abridge_c128*): the same recipe at half the block, ratio C / q = 4
        # (K = 32; per-layer K = 64), every stage BLOCK_128_STEPS; block128/
        *_abridge_family(BLOCK_128, PAUSES_128),
        # the C = 64 variant family (opt-in arms): uniform 4:1 in two stages (a second from the 3,000-step model at
        # half the peak LR on fresh problems: the first ends at 0.55 answer accuracy with recall 0.935, its loss still
        # falling), 8:1 (half the steps: CPU time), the per-layer schedule (AbridgeKV §5.1: halve each layer's quota of
        # the uniform model in turn; held-out CE, 32 training-stream problems; three levels at the same mean quota;
        # its doubled layer needs K = 2q = 32 code positions) retrained from the base model in the same two stages
        Model("abridge_c64_4to1", _abridge(16), needs=("base",)),
        Model("abridge_c64_4to1_more", _abridge(16, steps=2000, extra=SECOND_STAGE, start="abridge_c64_4to1"),
              needs=("abridge_c64_4to1",)),
        Model("abridge_c64_8to1", _abridge(8, steps=1500), needs=("base",)),
        Model("abridge_c64_alloc", _allocate("abridge_c64_4to1"), needs=("abridge_c64_4to1",)),
        Model("abridge_c64_perlayer", _abridge(None, extra=(_schedule("abridge_c64_alloc"),), pauses=2 * PAUSES),
              needs=("base", "abridge_c64_alloc")),
        Model("abridge_c64_perlayer_more",
              _abridge(None, steps=2000, start="abridge_c64_perlayer", pauses=2 * PAUSES,
                       extra=(_schedule("abridge_c64_alloc"), *SECOND_STAGE)),
              needs=("abridge_c64_perlayer", "abridge_c64_alloc")),
        # KVzap (README, KVzap on the testbed): pairs from the base model's own hidden states on training-stream
        # traces, then the linear and MLP surrogates; the arms serve the base model with them
        Model("kvzap_pairs", ("+pipeline=kvzap_pairs_testbed", "model=tiny-testbed", "model.hf_id={base}"),
              needs=("base",), entry="data_prep", done="runs/kvzap/{base_name}/pairs/manifest.json", serves="base"),
        Model("kvzap", ("+method=kvzap", "model=tiny-testbed", "model.hf_id={base}"), needs=("base", "kvzap_pairs"),
              done="runs/kvzap/{base_name}/mlp/model.safetensors", serves="base"),
    ]
}

EVICTORS = ("evict_recency", "evict_random", "evict_attention")  # AbridgeKV's ablations: keep q of each completed block
_C64 = {"ratio": BLOCK / PAUSES, "block_size": BLOCK}
_PERLAYER = {"schedule": "per-layer (abridge_allocate)"}


def _abridge_arms(block: int, pauses: int, suffix: str, default: bool, snapkv: bool = False) -> list[Arm]:
    """The arms of the AbridgeKV family ``_abridge_family(block, pauses)``, named ``abridge{suffix}…``: AbridgeKV 4:1
    as the paper defines it, the per-layer ("dynamic") schedule (quotas measured by ``abridge_allocate``, then retrained),
    after its three stages (``abridge{suffix}``) and after the first (``…_perlayer_1500steps``); the paper's "uniform
    setting" at 4:1 (``…_uniform``) and uniform 8:1 (``…_8to1``); StreamingLLM, H2O, R-KV and R-KV serving (+12%, the
    paper's) at 4:1's measured rows (the uniform and per-layer models keep the same mean quota, so the same rows),
    StreamingLLM and H2O at 8:1's; the block evictors at q = ``pauses`` of ``block``; ``snapkv``: SnapKV at 4:1's
    rows too. The main family (suffix "") names the baselines as their methods; a variant's baselines carry
    ``@abridge{suffix}`` (evictors ``{suffix}``). Until 2026-12-06 ``abridge{suffix}`` named the uniform model and
    the per-layer one was ``abridge{suffix}_perlayer``."""
    c, a = f"abridge_c{block}", f"abridge{suffix}"
    fields = {"ratio": block / pauses, "block_size": block}
    boundary_steps = BLOCK_128_STEPS * block // BLOCK_128
    perlayer = {**fields, **_PERLAYER, "steps": 2 * BLOCK_128_STEPS + boundary_steps,
                "boundary_data": f"stage 2 of 3 (data.boundary_rate=1.0, {boundary_steps:,} steps)"}
    at = "" if not suffix else f"@{a}"
    return [
        Arm(a, "abridge", f"{c}_perlayer_more", extra=perlayer, default=default),
        Arm(f"{a}_uniform", "abridge", f"{c}_4to1", extra={**fields, "steps": BLOCK_128_STEPS}, default=default),
        Arm(f"{a}_8to1", "abridge", f"{c}_8to1", extra={**fields, "ratio": block / (pauses // 2), "steps": BLOCK_128_STEPS},
            default=default),
        Arm(f"{a}_perlayer_1500steps", "abridge", f"{c}_perlayer", extra={**fields, **_PERLAYER, "steps": BLOCK_128_STEPS},
            default=default),
        # SnapKV is prefill only: the testbed prompt is 6 tokens
        *(Arm(f"{b}{at}", b, "base", match=a, default=default)
          for b in ("streaming", "h2o", *(("snapkv",) if snapkv else ()), "rkv")),
        Arm(f"rkv_serving{at}", "rkv_serving", "base", match=a, match_scale=1.12, default=default),
        *(Arm(f"{e}{suffix}", e, "base", (f"method.block_size={block}", f"method.quota={pauses}"), method_yaml=e,
              default=default) for e in EVICTORS),
        *(Arm(f"{b}@{a}_8to1", b, "base", match=f"{a}_8to1", default=default) for b in ("streaming", "h2o")),
    ]  # fmt: skip


# What the default plan costs on this machine (2 cores, 1,024-token traces; README "From scratch", 2026-12-05): minutes
# of each model's training, one after another, and of one arm of 256 problems (the 40 default arms took 21.7 min two
# at a time). The variants' models have no entry (the C = 128 family ≈ 52 min in all, C = 64 ≈ 81 min).
TRAIN_MINUTES = {
    "base": 17.9, "base_sum": 20.4, "base_sum_cue": 18.9, "abridge_c256_4to1": 9.6, "abridge_c256_8to1": 6.8,
    "abridge_c256_alloc": 0.2, "abridge_c256_perlayer": 12.4, "abridge_c256_perlayer_boundary": 23.4,
    "abridge_c256_perlayer_more": 12.0, "kvzap_pairs": 0.4, "kvzap": 0.3, "lightthinker": 6.6,
}  # fmt: skip
ARM_MINUTES = 21.7 / 40
MEASURED_AT = {"trace_tokens": 1024, "n": 256, "threads": 2}

# 2026-12-06: the arm named as its method runs the paper's AbridgeKV (the per-layer schedule); old name -> new
RENAMED = {
    "abridge_perlayer": "abridge", "abridge": "abridge_uniform",
    "abridge_c128_perlayer": "abridge_c128", "abridge_c128": "abridge_c128_uniform",
    "abridge_c64_perlayer": "abridge_c64", "abridge_c64": "abridge_c64_uniform",
    "abridge_c64_3000steps": "abridge_c64_uniform_3000steps",
}  # fmt: skip


def renamed_hint(name: str) -> str:
    """What an arm name meant before the 2026-12-06 rename, for a message about it ("" if it was not renamed)."""
    return (f" (arm names changed on 2026-12-06: what was called {name} is {RENAMED[name]} now; "
            "analysis/results/miniature/runs/README.md)") if name in RENAMED else ""


ARMS: dict[str, Arm] = {
    a.name: a
    for a in [
        Arm("full", "full", "base"),
        # AbridgeKV at C = 256 (BLOCK_256; the main block size since 2026-12-05, block256/) and its baselines
        *_abridge_arms(BLOCK_256, PAUSES_256, "", default=True, snapkv=True),
        # the C = 128 variant (not run by default: ≈ 52 min of training; the main block size 2026-12-05 before C = 256)
        *_abridge_arms(BLOCK_128, PAUSES_128, "_c128", default=False),
        # the C = 64 variant (not run by default: ~81 min of training): per-layer after 5,000 and 3,000 steps, uniform
        # 4:1 after 5,000 and 3,000, 8:1 after 1,500, the eviction baselines and the block evictors at its rows
        Arm("abridge_c64", "abridge", "abridge_c64_perlayer_more", extra={**_C64, **_PERLAYER, "steps": 5000},
            default=False),
        Arm("abridge_c64_uniform", "abridge", "abridge_c64_4to1_more", extra={**_C64, "steps": 5000}, default=False),
        Arm("abridge_c64_uniform_3000steps", "abridge", "abridge_c64_4to1", extra={**_C64, "steps": ABRIDGE_STEPS},
            default=False),
        Arm("abridge_c64_8to1", "abridge", "abridge_c64_8to1", extra={**_C64, "ratio": BLOCK / 8, "steps": 1500},
            default=False),
        Arm("abridge_c64_perlayer_3000steps", "abridge", "abridge_c64_perlayer",
            extra={**_C64, **_PERLAYER, "steps": ABRIDGE_STEPS}, default=False),
        *(Arm(f"{b}@abridge_c64{r}", b, "base", match=f"abridge_c64{r}", default=False)
          for r in ("", "_8to1") for b in ("streaming", "h2o")),
        *(Arm(f"{e}_c64", e, "base", (f"method.block_size={BLOCK}", f"method.quota={PAUSES}"), method_yaml=e,
              default=False) for e in EVICTORS),
        *(Arm(f"kvzap@{t:g}", "kvzap", "kvzap", (f"method.threshold={t}",), extra={"threshold": t})
          for t in KVZAP_THRESHOLDS),
        *(Arm(f"kvzap_linear@{t:g}", "kvzap_linear", "kvzap", (f"method.threshold={t}",), extra={"threshold": t})
          for t in KVZAP_THRESHOLDS),
        Arm("kvzip", "kvzip", "base"),  # KVzip+ oracle (labelled kvzap_oracle in results before the rename)
        Arm("full_summaries", "full", "base_sum_cue"),
        Arm("zoomr", "zoomr", "base_sum_cue", (f"method.window={ZOOMR_WINDOW}",)),
        Arm("sumr", "sumr", "base_sum_cue", (f"method.window={ZOOMR_WINDOW}",)),
        Arm("streaming@zoomr", "streaming", "base_sum_cue", match="zoomr"),
        Arm("h2o@zoomr", "h2o", "base_sum_cue", match="zoomr"),
        # a variant, not the paper's rule: only the last layer votes (layer 0 cannot see the cue at ":"; on the
        # validation seed 1,000,003, teacher-forced, the last layer alone hits 0.997, layer 1 0.835, every layer 0.939)
        Arm("zoomr_vote_last_layer", "zoomr", "base_sum_cue", (f"method.window={ZOOMR_WINDOW}", "method.vote_layers=[2]")),
        # a variant: three paragraphs zoomed in per selection (c = 3; the paper's default is 2): more rows, fewer misses
        Arm("zoomr_c3", "zoomr", "base_sum_cue", (f"method.window={ZOOMR_WINDOW}", "method.consensus=3")),
    ]
}


def _add_tables() -> None:
    """LightThinker's model and arms (analysis/miniature_lightthinker.py: the same fields, as dicts)."""
    from analysis import miniature_lightthinker as lt

    MODELS.update({k: Model(k, **v) for k, v in lt.MODELS.items()})
    ARMS.update({k: Arm(k, **v) for k, v in lt.ARMS.items()})


_add_tables()


def full_arm(arm: Arm) -> str:
    """The full-KV arm an arm is paired with: the same model family's (plain or summaries traces)."""
    model = MODELS[arm.model]
    while not model.summaries and model.needs:  # a fine-tune pairs with the full KV of its base
        model = MODELS[model.needs[0]]
    return "full_summaries" if model.summaries else "full"


def training_seeds(models: list[str]) -> dict[int, list[str]]:
    """Testbed stream seed -> the models that train on it (``data.seed``, default 0; KVzap's pairs: their stream)."""
    from zoomr.schemas.kvzap import TestbedPairsSource
    from zoomr.schemas.testbed import TestbedData

    seeds: dict[int, list[str]] = {}
    for name in models:
        m = MODELS[name]
        if m.entry == "data_prep":
            seed = TestbedPairsSource().seed
        elif any(o.startswith("data=testbed") for o in m.overrides):
            given = [int(o.split("=", 1)[1]) for o in m.overrides if o.startswith("data.seed=")]
            seed = given[-1] if given else TestbedData().seed
        else:
            continue
        seeds.setdefault(seed, []).append(name)
    return seeds


ALL = "all"  # task.arms=[all]: every arm, the variants too


def plan(names: list[str]) -> tuple[list[str], list[str]]:
    """(models to train, arms to evaluate) in dependency order for the arms ``names`` (empty: every default arm;
    ``[all]``: every arm)."""
    if ALL in names and len(names) > 1:
        raise SettingsError(f"task.arms={list(names)}: '{ALL}' runs every arm; give it alone")
    wanted = list(ARMS) if list(names) == [ALL] else list(names) or [a for a in ARMS if ARMS[a].default]
    unknown = [n for n in wanted if n not in ARMS]
    if unknown:
        hints = "".join(renamed_hint(n) for n in unknown)
        raise SettingsError(f"unknown miniature arm(s) {unknown}{hints}; known: {sorted(ARMS)}")
    arms: list[str] = []

    def add_arm(name: str) -> None:
        arm = ARMS[name]
        for dep in (arm.match, full_arm(arm)):
            if dep and dep != name and dep not in arms:
                add_arm(dep)
        if name not in arms:
            arms.append(name)

    for n in wanted:
        add_arm(n)
    models: list[str] = []

    def add_model(name: str) -> None:
        for dep in MODELS[name].needs:
            add_model(dep)
        if name not in models:
            models.append(name)

    for a in arms:
        add_model(ARMS[a].model)
    return models, arms
