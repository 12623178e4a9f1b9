"""AbridgeKV layout, quotas and schedule: invariants of the interleaved stream (no model needed)."""

from __future__ import annotations

import pytest

from zoomr.abridge.layout import IGNORE, PAUSE, PROMPT, RAW, AbridgeLayout, interleave
from zoomr.abridge.optim import lr_factor
from zoomr.abridge.quotas import (
    halve_layer,
    level_counts,
    pause_positions_needed,
    resolve_quotas,
    save_schedule,
    three_level_schedule,
)

PAUSES = [900 + i for i in range(4)]


def _stream(n_resp: int, mode: str = "spread", c: int = 8, k: int = 4):
    prompt = [1, 2, 3]
    response = list(range(100, 100 + n_resp))
    return prompt, response, interleave(prompt, response, AbridgeLayout(c, k, mode), PAUSES[:k])


@pytest.mark.parametrize("n_resp", [1, 7, 8, 9, 16, 17, 30])
@pytest.mark.parametrize("mode", ["spread", "tail", "appended"])
def test_every_response_token_is_predicted_once_in_order(n_resp, mode):
    prompt, response, s = _stream(n_resp, mode)
    assert [t for t in s.labels if t != IGNORE] == response
    # no label is a pause token, and the token carrying each label sits right before it in the stream
    for i, lab in enumerate(s.labels):
        if lab != IGNORE:
            assert s.input_ids[i + 1] == lab and s.kind[i + 1] == RAW
    # pauses follow exactly the completed blocks that are followed by more response tokens
    n_pause_blocks = sum(1 for b in range((n_resp - 1) // 8) if (b + 1) * 8 < n_resp)
    assert s.kind.count(PAUSE) == 4 * n_pause_blocks
    assert s.kind[: len(prompt)] == [PROMPT] * 3


def test_raw_positions_ignore_pauses_and_code_rows_sit_inside_the_block():
    _, _, s = _stream(20, "spread")
    raw_pos = [p for p, k in zip(s.position_ids, s.kind) if k == RAW]
    assert raw_pos == list(range(3, 23))  # as if there were no pause tokens
    for b in (0, 1):
        pos = [p for p, k, bb in zip(s.position_ids, s.kind, s.block) if k == PAUSE and bb == b]
        start = 3 + 8 * b
        assert pos == [start + 1, start + 3, start + 5, start + 7]  # end of each quarter of the block
        assert all(start <= p < start + 8 for p in pos)


def test_tail_and_appended_positions():
    _, _, tail = _stream(12, "tail")
    assert [p for p, k in zip(tail.position_ids, tail.kind) if k == PAUSE] == [7, 8, 9, 10]
    _, _, app = _stream(12, "appended")
    assert app.position_ids == list(range(len(app)))  # pause tokens are ordinary stream tokens


def test_layout_rejects_bad_settings():
    with pytest.raises(ValueError, match="inside a block"):
        AbridgeLayout(block_size=4, num_pause=8)
    AbridgeLayout(block_size=4, num_pause=8, code_positions="appended")
    with pytest.raises(ValueError, match="num_pause"):
        AbridgeLayout(64, 257)
    with pytest.raises(ValueError, match="code_positions"):
        AbridgeLayout(64, 16, "middle")


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["layout"].update(block_size="big"), "block_size must be an integer, got 'big'"),
        (lambda d: d.pop("layout"), "KeyError: 'layout'"),
        (lambda d: d.update(quotas=[8, 8.5]), r"quotas must be a list of integers, got \[8, 8.5\]"),
        (lambda d: d["layout"].update(extra=1), "unexpected keyword argument 'extra'"),
    ],
)
def test_an_edited_abridge_json_is_refused_naming_the_file(tmp_path, edit, message):
    """A layout field of the wrong type reached the serving policy as "'<' not supported between instances of
    'str' and 'int'"; a float quota was silently truncated."""
    import json

    from zoomr.abridge.artifacts import load_abridge_config, save_abridge_config

    path = save_abridge_config(tmp_path, AbridgeLayout(8, 4), [2, 4], data="testbed")
    assert load_abridge_config(tmp_path) == (AbridgeLayout(8, 4), [2, 4], {"data": "testbed"})
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=f"{path}: not the record \\+method=abridge writes .*{message}"):
        load_abridge_config(tmp_path)


def test_paper_three_level_schedule_preserves_the_mean():
    costs = [float((7 * i) % 36) for i in range(36)]
    sched = three_level_schedule(costs, base=128)
    assert sched.count(256) == 6 and sched.count(64) == 12 and sched.count(128) == 18
    assert sum(sched) == 36 * 128
    ranked = sorted(range(36), key=lambda i: -costs[i])
    assert {i for i, q in enumerate(sched) if q == 256} == set(ranked[:6])
    assert {i for i, q in enumerate(sched) if q == 64} == set(ranked[-12:])


def test_tiny_schedule_and_limits():
    assert level_counts(4) == (1, 2) and level_counts(2) == (0, 0)
    assert three_level_schedule([0.1, 0.0, 0.5, 0.2], base=8) == [4, 4, 16, 8]
    assert pause_positions_needed([4, 4, 16, 8], num_pause=16) == 16  # a uniform K/2 model: K suffices
    assert pause_positions_needed(three_level_schedule([0.1, 0.0, 0.5, 0.2], base=16), num_pause=16) == 32
    with pytest.raises(ValueError, match="odd quota"):
        three_level_schedule([0.1, 0.0, 0.5, 0.2], base=7)
    assert halve_layer([8, 8, 8], 1) == [8, 4, 8]


def test_quotas_uniform_default_and_schedule_file(tmp_path):
    assert resolve_quotas(4, 16, None, None) == [8] * 4
    path = save_schedule(tmp_path / "s.json", [4, 4, 16, 8])
    assert resolve_quotas(4, 16, 3, str(path)) == [4, 4, 16, 8]
    with pytest.raises(ValueError, match="3 layers"):
        resolve_quotas(3, 16, None, str(path))
    with pytest.raises(ValueError, match=r"\[0, K=8\]"):
        resolve_quotas(4, 8, None, str(path))
    path.write_text('{"quotas": [4, 4, 16, 8.5]}')  # was truncated to 8 without a word
    with pytest.raises(ValueError, match=r"s.json: expected a JSON object with a 'quotas' list of integers, got \[4, 4, 16, 8.5\]"):
        resolve_quotas(4, 16, None, str(path))


def test_lr_schedule_warmup_constant_decay():
    total = 1000
    f = [lr_factor(s, total) for s in range(total)]
    assert f[0] == pytest.approx(1 / 30) and f[29] == pytest.approx(1.0)
    assert all(x == 1.0 for x in f[30:800])
    assert f[-1] == pytest.approx(0.1) and all(a >= b for a, b in zip(f[800:], f[801:]))


@pytest.mark.parametrize("mode", ["spread", "appended"])
def test_loss_positions_label_exactly_those_response_tokens(mode):
    """The testbed trains on what the model writes: only the chosen response tokens get a label, each
    once, carried by the stream token just before it (a pause when the token opens a block)."""
    response = list(range(100, 130))
    chosen = [0, 7, 8, 16, 29]  # the first token, a block's last, a block's first (after pauses), the last
    s = interleave([1, 2, 3], response, AbridgeLayout(8, 4, mode), PAUSES, loss_positions=chosen)
    assert [t for t in s.labels if t != IGNORE] == [response[j] for j in chosen]
    for i, lab in enumerate(s.labels):
        if lab != IGNORE:
            assert s.input_ids[i + 1] == lab and s.kind[i + 1] == RAW
    assert s.input_ids == interleave([1, 2, 3], response, AbridgeLayout(8, 4, mode), PAUSES).input_ids
    with pytest.raises(ValueError, match="loss position 30 outside"):
        interleave([1, 2, 3], response, AbridgeLayout(8, 4, mode), PAUSES, loss_positions=[30])
