"""errors.VllmOffloadError.named: a model's error as its [[models]] entry's, its kind kept,
for the error family's every shape of constructor (found in review: copy.copy rebuilt a
FieldError with one argument and raised TypeError, a 500 for a model outside the roots)."""

from __future__ import annotations

import pytest

from vllm_offload.config.schema import ConfigError
from vllm_offload.errors import Forbidden, Refused, VllmOffloadError
from vllm_offload.model.hub import HubUnreachable
from vllm_offload.plan import PlanError


@pytest.mark.parametrize(
    "error",
    [
        ConfigError("model.path", "outside the roots"),
        PlanError("model.max_model_len", "too long", instead={"model.max_model_len": "auto"}),
        Refused("model", "busy"),
        Forbidden("extra_args", "no"),
        HubUnreachable("org/x: cannot reach"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_named_keeps_the_kind_and_says_the_entry(error: VllmOffloadError) -> None:
    renamed = error.named("models[1].path", "'coder': " + error.message)
    assert type(renamed) is type(error) and renamed.exit_code == error.exit_code
    assert renamed.field == "models[1].path" and renamed.message.startswith("'coder': ")
    assert str(renamed) == f"models[1].path: {renamed.message}"
    assert error.field != "models[1].path"  # the original unchanged
    if isinstance(error, PlanError):
        assert renamed.instead == error.instead  # type: ignore[attr-defined]
