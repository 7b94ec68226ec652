"""The one reader of our --additional-config keys (vllm_ext.knobs): a value patched vLLM's
hooks cannot use is refused naming the key, before anything is sized from it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_offload.vllm_ext import knobs
from vllm_offload.vllm_ext.knobs import HOST_EXTENSION_KEY, STAGING_TOKENS_KEY


def config(**given: object) -> SimpleNamespace:
    return SimpleNamespace(additional_config=given)


def test_a_whole_number_reads_as_given_and_absent_is_zero() -> None:
    assert knobs.whole_number(config(**{STAGING_TOKENS_KEY: 4096}), STAGING_TOKENS_KEY, "t") == 4096
    assert knobs.whole_number(config(), STAGING_TOKENS_KEY, "tokens") == 0
    assert knobs.whole_number(None, STAGING_TOKENS_KEY, "tokens") == 0  # no config at all
    assert knobs.whole_number(SimpleNamespace(additional_config=None), HOST_EXTENSION_KEY, "b") == 0


@pytest.mark.parametrize("value", [True, -1, 1.5, "4096", None])
def test_anything_else_is_refused_naming_the_key(value: object) -> None:
    with pytest.raises(ValueError, match=f"--additional-config {HOST_EXTENSION_KEY} must be a"):
        knobs.whole_number(config(**{HOST_EXTENSION_KEY: value}), HOST_EXTENSION_KEY, "bytes")


def test_another_value_is_read_as_given_with_its_default() -> None:
    assert knobs.additional(config(x=0.25), "x", 1.0) == 0.25
    assert knobs.additional(config(), "x", 1.0) == 1.0
    assert knobs.additional(object(), "x", 1.0) == 1.0
