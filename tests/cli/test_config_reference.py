"""The committed configuration reference is what the schema says (issue #38, item 7)."""

from __future__ import annotations

from pathlib import Path

from vllm_offload import config
from vllm_offload.cli.config_cmd import reference_markdown

REFERENCE = Path(__file__).parents[2] / "docs" / "config.md"


def test_docs_config_md_is_the_schema_s_reference() -> None:
    assert REFERENCE.read_text() == reference_markdown(), (
        "docs/config.md is out of step: run `vllm-offload config reference > docs/config.md`"
    )


def test_every_key_is_in_the_reference() -> None:
    text = reference_markdown()
    for section, model in config.SECTIONS.items():
        assert f"## [{section}]" in text
        for key in model.model_fields:
            assert f"| `{key}` |" in text, f"{section}.{key}"
