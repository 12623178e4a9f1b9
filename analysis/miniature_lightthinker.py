"""LightThinker's part of the miniature reproduction (issues 14 and 15): its model and arms as plain data.

Read by the miniature plan (:mod:`analysis.miniature_plan`), which builds its ``Model`` / ``Arm`` entries from
these dicts (same field names): ``MODELS[name]`` = train overrides (``{base}`` = the base model's ``final/``
checkpoint) and what it starts from; ``ARMS[name]`` = the eval arm (policy name as in ``conf/method/``, the
model it runs on, its eval overrides, the arm whose measured rows a baseline gets).

How a thought ends on the testbed. The environment writes the paragraph break, so LightThinker's policy would
never see a thought end; ``data.thought_splitter=true`` (train) and ``+benchmark.options.thought_splitter=true``
(eval) leave the position after each break to the model, which writes ``<|splitter|>`` there (a model-written
token with a loss, like an answer); the policy then compresses the paragraph (break and splitter included)
into n = 7 cache tokens (the paper's n for Llama; ``tiny-testbed`` is a llama) and frees it. The test problems
are the same problems as without splitters (same ids, facts and queries; each paragraph one token longer), so
the arm pairs with the base model's full-KV arm problem by problem.

Testbed settings, each with its reason:
- ``method.max_response_tokens=1200``: a 1,024-token trace plus one splitter per paragraph (~23) and the end of
  turn; the trainer refuses a value that would cut a response (set it to ``trace_tokens + 176`` for others).
- ``data.n_train=100000``: problems are generated on access (nothing materialised), so no problem repeats.
- ``method.optim.learning_rate=1e-3``, batch 4, warm-up 3 %, flat to 80 %, decay to 10 %: AbridgeKV's testbed
  schedule (MINIATURE_NOTES), so the two compressing fine-tunes train alike.
- ``LIGHTTHINKER_STEPS = 1500``: the length of a uniform AbridgeKV stage, so the two compressing fine-tunes get
  the same steps (6.6 min on 2 threads). Until 2026-12-05 it was 200, what one shared core afforded when the arm
  was first run: on the validation seed 1,000,003 (512 problems) the 200-step model answers 0.627 and the
  1,500-step one 0.955, against full KV's 0.984 (``analysis/results/miniature/lightthinker_steps/``).
"""

from __future__ import annotations

LIGHTTHINKER_STEPS = 1500

MODELS: dict[str, dict] = {
    "lightthinker": {
        "overrides": (
            "+method=lightthinker", "data=testbed", "data.thought_splitter=true", "data.n_train=100000",
            "model=tiny-testbed", "method.init_from={base}", "method.max_response_tokens=1200",
            f"method.max_steps={LIGHTTHINKER_STEPS}", "method.eval_steps=250", "method.save_steps=250",
            "method.logging_steps=50",
        ),
        "needs": ("base",),
    },
}

_SPLITTERS = ("+benchmark.options.thought_splitter=true",)

ARMS: dict[str, dict] = {
    "lightthinker": {"method": "lightthinker", "model": "lightthinker", "overrides": _SPLITTERS},
    # the eviction baselines at LightThinker's measured rows, on the base model (traces without splitters)
    "streaming@lightthinker": {"method": "streaming", "model": "base", "match": "lightthinker"},
    "h2o@lightthinker": {"method": "h2o", "model": "base", "match": "lightthinker"},
}
