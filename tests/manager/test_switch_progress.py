"""The switch progress the page shows (issue #43), read from the front door's /models row:
the step under way, for how long, the requests waiting, the last steps' lengths. Whoever
runs as the server's user can answer on the control socket, so each value is taken only
if it is of its kind."""

from __future__ import annotations

import json

from vllm_offload.manager.routes.status import progress


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
