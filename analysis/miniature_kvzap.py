"""KVzap in the testbed miniature (issue 15): the exact commands, as plain data for ``analysis +task=miniature``.

Nothing here runs anything. ``{base}`` stands for the testbed base model directory (no summaries, cue
format, 3 layers; trained by :data:`BASE_TRAIN`); substitute it with ``str.format(base=...)``.

- :data:`MODELS`: what KVzap needs before its arms can run, in order, as ``python -m <entry> <overrides>``:
  the pairs (``data_prep``, the base model's own hidden states on testbed traces of the training stream
  2, scored by the recall pretext; ~70 s here) and the linear and MLP surrogates fitted on them
  (``train``, ~30 s; held-out R² per head against the constant predictor in ``r2.json``/``summary.json``).
- :data:`EVAL_COMMON`: the overrides every KVzap arm shares (greedy, 1,100 new tokens, batch 64); the
  miniature adds its own ``benchmark.options.n_test`` / ``+benchmark.options.test_seed`` and ``run_dir``.
- :data:`ARMS`: the eval overrides per arm name (``kvzap_linear@<τ>``, ``kvzap@<τ>``, ``kvzip``).
  ``kvzap@<τ>`` is the paper's default surrogate (MLP) at threshold τ, ``kvzap_linear@<τ>`` KVzap-Linear;
  both prune in prefill and decoding with the paper's window w = 128. ``kvzip`` is the KVzip+
  oracle at its default (prefill only, ratio 0.5): on the testbed the prompt is the 6-token chat header and
  every fact arrives during decoding, so it removes almost nothing (measured in the README's KVzap section).
"""

from __future__ import annotations

BASE_TRAIN: list[str] = [
    "+method=sft_testbed",
    "data=testbed",
    "data.query_form=cue",
    "model=tiny-testbed",
    "model.tiny.num_hidden_layers=3",
]

MODEL: list[str] = ["model=tiny-testbed", "model.hf_id={base}"]

MODELS: dict[str, dict[str, object]] = {
    "kvzap_pairs": {"entry": "data_prep", "overrides": ["+pipeline=kvzap_pairs_testbed", *MODEL]},
    "kvzap_surrogates": {"entry": "train", "overrides": ["+method=kvzap", *MODEL], "after": ["kvzap_pairs"]},
}

EVAL_COMMON: list[str] = [
    "benchmark=testbed",
    *MODEL,
    "+benchmark.options.query_form=cue",
    "generation.temperature=0",
    "generation.n_samples=1",
    "generation.max_new_tokens=1100",
    "generation.batch_size=64",
]

THRESHOLDS: list[float] = [-8.0, -7.0, -6.0, -5.0, -4.0]


def _tau(t: float) -> str:
    return f"{t:g}"


ARMS: dict[str, list[str]] = {
    **{
        f"kvzap_linear@{_tau(t)}": ["+method=kvzap_linear", f"method.threshold={t}", f"run_name=kvzap_linear_tau{_tau(t)}"]
        for t in THRESHOLDS
    },
    **{f"kvzap@{_tau(t)}": ["+method=kvzap", f"method.threshold={t}", f"run_name=kvzap_tau{_tau(t)}"] for t in THRESHOLDS},
    "kvzip": ["+method=kvzip"],  # the KVzip+ oracle (labelled kvzap_oracle in results before the rename)
}
