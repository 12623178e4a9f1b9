"""The committed trained testbed summaries model (analysis/results/zoomr_testbed/model, 1.5 MB): its queries
point at their summaries better than chance under ZoomR's rule (issue 13).

Teacher-forced on 32 fixed problems of a held-out seed (about 1,500 cues, ~2 s). The thresholds sit below the
measured values (README, analysis/results/zoomr_testbed/) and well above chance, so the test fails if the
model, the pointer scoring or the segment bookkeeping regress to chance.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # ~15 s on an idle core, 2 min on the shared machine

HIT_MARGIN = 0.10  # measured (256 problems): paper rule 0.454 vs chance 0.280; layer 1 0.459 vs layer 0 0.283
FAR_MARGIN = 0.03  # measured: 0.361 for facts outside the 64-row window (their chance is below the overall 0.280)
MODEL = Path(__file__).resolve().parents[1] / "analysis" / "results" / "zoomr_testbed" / "model"


@pytest.fixture(scope="module")
def rates():
    from analysis.testbed_pointer import teacher_forced_hit_rate
    from zoomr.testbed.checkpoint import load_testbed_model, trained_data

    assert (MODEL / "model.safetensors").exists(), f"the committed testbed model is missing: {MODEL}"
    model, _ = load_testbed_model(MODEL)
    return teacher_forced_hit_rate(model, trained_data(MODEL, test_seed=2_000_003), n=32)


def test_paper_rule_hit_rate_beats_chance(rates):
    paper = rates["paper"]
    assert paper["cues"] > 1000
    assert paper["hit_rate"] >= paper["chance"] + HIT_MARGIN, paper
    assert paper["hit_rate_far"] >= paper["chance"] + FAR_MARGIN, paper


def test_the_trained_layer_points_and_layer_zero_cannot(rates):
    """Only layer 1 is trained to point (layer 0's query at ':' cannot see the key): it must beat layer 0."""
    assert rates["layer1"]["hit_rate"] >= rates["layer0"]["hit_rate"] + HIT_MARGIN, rates
    assert abs(rates["layer0"]["hit_rate"] - rates["layer0"]["chance"]) < 0.08, rates["layer0"]


POINTER_MODEL = Path(__file__).resolve().parents[1] / "analysis" / "results" / "miniature" / "summaries_model"


def test_the_miniature_summaries_model_points_at_its_summaries():
    """The miniature's ZoomR model (base_sum_cue: paragraph topics, the pointer loss at the boundary and the topic,
    then the cue-view stage, issue 13; a phi3 with RoPE on half of each head's dims; 2 MB, committed): measured
    teacher-forced on these 32 problems (1,445 cues), under ZoomR's view at the cue (the cue rows see only the prompt
    and the window, as in decoding) 1.000 for the paper's rule, far and layers 1 and 2 alone, 0.291 for layer 0
    (chance 0.284); with full attention 1.000. The bars fail on a regression to the keys-form model of attempt 8
    (0.968 under the cue view, far 0.962), the all-RoPE llama's 0.890, or a model that points only by attending to
    the summary (0.587 under the cue view)."""
    from analysis.testbed_pointer import teacher_forced_hit_rate
    from zoomr.testbed.checkpoint import load_testbed_model, trained_data

    model, _ = load_testbed_model(POINTER_MODEL)
    data = trained_data(POINTER_MODEL, test_seed=2_000_003)
    r = teacher_forced_hit_rate(model, data, n=32, cue_view=True)
    assert data.paragraph_topics and r["paper"]["cues"] > 1000
    assert r["paper"]["hit_rate"] >= 0.99 and r["paper"]["hit_rate_far"] >= 0.99, r["paper"]
    assert r["layer1"]["hit_rate"] >= 0.99 and r["layer2"]["hit_rate"] >= 0.99, (r["layer1"], r["layer2"])
    assert abs(r["layer0"]["hit_rate"] - r["layer0"]["chance"]) < 0.08, r["layer0"]  # layer 0 cannot see the key
    assert teacher_forced_hit_rate(model, data, n=32)["paper"]["hit_rate"] >= 0.99
