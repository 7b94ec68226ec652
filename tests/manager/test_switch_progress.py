"""The switch progress the page shows (issue #43), read from the front door's /models row:
the step under way, for how long, the requests waiting, the last steps' lengths. Whoever
runs as the server's user can answer on the control socket, so each value is taken only
if it is of its kind."""

from __future__ import annotations

import json

from vllm_offload.manager.switches import ended, progress


def test_a_front_door_s_row_becomes_the_card_s_progress() -> None:
    row = {
        "status": "away",
        "waiting": 2,
        "step": "bring-in",
        "step_elapsed_s": 3.4,
        "bring_in_s": 12,
        "put_away_s": None,
        "expected_wait_s": 0.0,
    }
    assert progress(row) == {
        "step": "bring-in",
        "elapsed_s": 3.4,
        "waiting": 2,
        "last_bring_in_s": 12.0,
        "last_put_away_s": None,
        "expected_wait_s": 0.0,
    }


def test_values_not_of_their_kind_are_unknown() -> None:
    hostile = json.loads(
        '{"step": "<script>", "step_elapsed_s": Infinity, "waiting": true,'
        ' "bring_in_s": -1, "put_away_s": "5", "expected_wait_s": 1e400}'
    )
    assert progress(hostile) == {
        "step": None,
        "elapsed_s": None,
        "waiting": 0,
        "last_bring_in_s": None,
        "last_put_away_s": None,
        "expected_wait_s": None,
    }
    assert progress({"waiting": 10**400, "bring_in_s": 10**400})["waiting"] == 0
    assert progress({"bring_in_s": 10**400})["last_bring_in_s"] is None
    assert progress(None) == progress({}) == progress(["step"])


def test_the_steps_that_ended_become_the_strip_s_bars() -> None:
    events = [
        {"t": 110.5, "model": "coder", "step": "bring-in", "seconds": 20, "text": "started"},
        {"t": 90.0, "model": "chat", "step": "put-away", "seconds": 1.5, "text": "stopped"},
        {"t": 95.0, "model": "chat", "step": None, "seconds": None, "text": "failed"},
    ]
    assert ended(events, {"chat", "coder"}) == [
        {"model": "chat", "step": "put-away", "t": 90.0, "seconds": 1.5},
        {"model": "coder", "step": "bring-in", "t": 110.5, "seconds": 20.0},
    ]


def test_steps_not_of_their_kind_are_left_out() -> None:
    good = {"t": 1.0, "model": "chat", "step": "bring-in", "seconds": 2.0}
    hostile = json.loads(
        '[{"t": Infinity, "model": "chat", "step": "bring-in", "seconds": 1},'
        ' {"t": 1, "model": "<img>", "step": "bring-in", "seconds": 1},'
        ' {"t": 1, "model": "chat", "step": "<script>", "seconds": 1},'
        ' {"t": 1, "model": "chat", "step": "put-away", "seconds": -1},'
        ' {"t": true, "model": "chat", "step": "put-away", "seconds": 1},'
        ' {"t": 1, "model": ["chat"], "step": "put-away", "seconds": 1}, 7, null]'
    )
    assert ended([*hostile, good], {"chat"}) == [good]
    assert ended({"events": [good]}, {"chat"}) == ended(None, {"chat"}) == []
