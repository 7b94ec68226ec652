"""schemathesis against the manager's own OpenAPI schema, with and without the token:
no 5xx, every 4xx body says what is wrong, and no rejected request changes anything."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import make_host
from tests.manager.conftest import TOKEN, UNIT
from tests.test_argv_check import NASTY, string_fields
from vllm_offload import argv_check, deployment, disk_layout
from vllm_offload import config as config_mod
from vllm_offload.errors import Refused
from vllm_offload.manager import ManagerSettings, create_app
from vllm_offload.model import demo as demo_model
from vllm_offload.systemd.control import Systemd

BIN = Path(sys.executable).parent
_scratch = Path(__import__("tempfile").mkdtemp(prefix="manager-fuzz-"))
_models = _scratch / "models"
demo_model.write(_models / "demo")
CONFIG = _scratch / "etc" / "config.toml"
config_mod.save(
    config_mod.with_overrides(
        config_mod.DeploymentConfig(),
        {
            "model.path": str(_models / "demo"),
            "manager.model_roots": [str(_models)],
            "server.port": 1,
        },
    ),
    CONFIG,
)
_root = _scratch / "a" / "b" / "root"
(_root / "etc/systemd/system").mkdir(parents=True)
(_root / "etc/systemd/system/vllm.service").write_text(UNIT)
APP = create_app(
    ManagerSettings(
        config_path=CONFIG,
        token=TOKEN,
        unit="vllm",
        systemd=Systemd(
            systemctl=(str(BIN / "systemctl3"),), journalctl=(str(BIN / "journalctl3"),), root=_root
        ),
    )
)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)

# the dashboard itself redirects to /login; the static files hold no secret
PUBLIC = {"/healthz", "/login", "/", "/static/{name}"}
FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


def digest() -> str:
    return hashlib.sha256(CONFIG.read_bytes()).hexdigest()


def check(response: object, before: str) -> None:
    status = response.status_code  # type: ignore[attr-defined]
    assert status < 500, response.text  # type: ignore[attr-defined]
    if 400 <= status < 500:
        body = response.json()  # type: ignore[attr-defined]
        assert body.get("detail"), body  # every refusal says what is wrong
        assert digest() == before  # and changes nothing


@schema.parametrize()
@FUZZ
def test_fuzz_without_token(case: schemathesis.Case) -> None:
    before = digest()
    response = case.call()
    if case.path not in PUBLIC:
        # 405: schemathesis also tries methods the path does not have.
        assert response.status_code in (401, 405), (case.path, response.status_code)
    check(response, before)


@schema.exclude(path_regex="/api/service/.*").parametrize()
@FUZZ
def test_fuzz_with_token(case: schemathesis.Case) -> None:
    before = digest()
    response = case.call(headers={"Authorization": f"Bearer {TOKEN}"})
    check(response, before)


@pytest.fixture(autouse=True, scope="module")
def _restore_config() -> object:
    saved = CONFIG.read_bytes()
    yield
    CONFIG.write_bytes(saved)


RISKY_FLAGS = [
    "--trust-remote-code",
    "--trust-remote",
    "--chat-template",
    "--middleware",
    "--ssl-keyfile",
    "--allowed-local-media-path",
    "--tool-parser-plugin",
    "--host",
    "--model",
    "--port",
    "--max-model-len",
    "--api-key",
]


@FUZZ
@given(
    flag=st.sampled_from(RISKY_FLAGS),
    value=st.text(max_size=40),
    fenced=st.sampled_from(["", "model_roots", "api_extra_args", "host", "api_key_file"]),
)
def test_fuzz_the_fence(flag: str, value: str, fenced: str) -> None:
    """Issue #15's refusals under generated input: a config from the API that passes a
    flag which loads code, reads paths or opens the server, or that touches a fenced key,
    is refused (403 or 422) and changes nothing."""
    from starlette.testclient import TestClient

    config = config_mod.load(CONFIG).model_dump()
    config["extra_args"] = [flag, value]
    if fenced in ("model_roots", "api_extra_args"):
        config["manager"][fenced] = ["/"]
    elif fenced:
        config["server"][fenced] = value or "0.0.0.0"
    before = digest()
    with TestClient(APP) as client:
        response = client.put(
            "/api/config", json={"config": config}, headers={"Authorization": f"Bearer {TOKEN}"}
        )
    assert response.status_code in (403, 422), response.text
    check(response, before)


# Issue #29: every string field of the config, and every file the manager or the planner
# opens that someone else may have planted (a model folder's config.json and safetensors
# headers, the disk tier's status file and folder).
STRING_FIELDS = string_fields()
NASTY_TEXT = st.sampled_from(NASTY) | st.text(max_size=60)


@FUZZ
@given(field=st.sampled_from(STRING_FIELDS), value=NASTY_TEXT)
def test_fuzz_every_string_field(field: tuple[str, bool], value: str) -> None:
    """Sent through the API: refused (and nothing changes), or saved as a config whose
    command line vLLM's own parser reads exactly as the plan wrote it."""
    from starlette.testclient import TestClient

    key, is_list = field
    config = config_mod.load(CONFIG).model_dump()
    section, _, name = key.rpartition(".")
    (config[section] if section else config)[name] = [value] if is_list else value
    saved = CONFIG.read_bytes()
    before = digest()
    with TestClient(APP) as client:
        for method, path in (("post", "/api/config/preview"), ("put", "/api/config")):
            response = client.request(
                method, path, json={"config": config}, headers={"Authorization": f"Bearer {TOKEN}"}
            )
            check(response, before)
    try:
        if digest() != before:  # accepted and saved: the last line of defence agrees
            spec = deployment.prepare(config_mod.load(CONFIG), make_host(None), {}, None).spec
            argv_check.check(spec)
    finally:
        CONFIG.write_bytes(saved)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
MODEL_KEYS = [
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "vocab_size",
    "intermediate_size",
    "sliding_window",
    "sliding_window_pattern",
    "layer_types",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "num_experts",
    "moe_intermediate_size",
    "torch_dtype",
    "quantization_config",
    "architectures",
    "text_config",
    "tie_word_embeddings",
    "use_sliding_window",
    "model_type",
]
FUZZED = _models / "fuzzed"
shutil.copytree(_models / "demo", FUZZED)
BASE_CONFIG = json.loads((FUZZED / "config.json").read_text())


def plant(path: Path, kind: str, content: bytes) -> None:
    """``path`` as a regular file of ``content``, a FIFO, a link to /dev/zero or a folder."""
    if path.is_dir() and not path.is_symlink():
        path.rmdir()
    else:
        path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "folder":
        path.mkdir()
    else:
        path.write_bytes(content)


@FUZZ
@given(
    changes=st.dictionaries(st.sampled_from(MODEL_KEYS), JSON_VALUES, max_size=4),
    header=st.binary(max_size=64) | JSON_VALUES.map(lambda v: json.dumps({"w": v}).encode()),
    kinds=st.tuples(*[st.sampled_from(["file", "file", "fifo", "dev-zero", "folder"])] * 2),
)
def test_fuzz_the_model_folder(
    changes: dict[str, Any], header: bytes, kinds: tuple[str, str]
) -> None:
    """A planted config.json and safetensors file: the preview answers (422 naming
    model.path, or a plan), never a 500 nor a hang, and a plan has no negative size."""
    from starlette.testclient import TestClient

    text = json.dumps({**BASE_CONFIG, **changes}).encode()
    plant(FUZZED / "config.json", kinds[0], text)
    plant(FUZZED / "model.safetensors", kinds[1], len(header).to_bytes(8, "little") + header)
    config = config_mod.load(CONFIG).model_dump()
    config["model"]["path"] = str(FUZZED)
    before = digest()
    with TestClient(APP) as client:
        response = client.post(
            "/api/config/preview",
            json={"config": config},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
    check(response, before)
    if response.status_code == 200:
        plan = response.json()["plan"]
        assert all(v >= 0 for v in plan.values() if isinstance(v, int | float)), plan
    else:
        assert response.json()["detail"]["field"] == "model.path", response.text


@FUZZ
@given(
    content=st.binary(max_size=200) | JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    kind=st.sampled_from(["file", "file", "fifo", "dev-zero", "folder"]),
)
def test_fuzz_the_tier_status_file(content: bytes, kind: str) -> None:
    root = disk_layout.tier_root(str(_scratch / "nvme"))
    root.mkdir(parents=True, exist_ok=True)
    plant(root / disk_layout.STATUS_FILE, kind, content)
    status = disk_layout.read_status(str(_scratch / "nvme"))
    assert status is None or all(math.isfinite(v) for v in status.values())


@FUZZ
@given(
    entries=st.lists(
        st.tuples(
            st.sampled_from(["a", "a/b", "a/b/c", "m_0123456789ab_r0/abc/de_g0"]),
            st.sampled_from(
                [
                    "0123456789abcdef.bin",
                    "0123456789abcdef.bin_7.tmp",
                    "config.json",
                    ".lock",
                    "notes.txt",
                    "x",
                ]
            ),
            st.sampled_from(["file", "fifo", "link-out", "link-dir-out", "folder"]),
        ),
        max_size=8,
    )
)
def test_fuzz_the_tier_folder_a_clear_walks(entries: list[tuple[str, str, str]]) -> None:
    """Whatever the server's user planted in the tier's folder, clearing it (as root
    here) deletes nothing outside it, follows no link, and never hangs."""
    disk = Path(tempfile.mkdtemp(dir=_scratch))
    outside = disk / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "0123456789abcdef.bin").write_bytes(b"x")
    (outside / "config.json").write_text("{}")
    before = sorted(p.name for p in outside.rglob("*"))
    root = disk_layout.tier_root(str(disk))
    for folder, name, kind in entries:
        (root / folder).mkdir(parents=True, exist_ok=True)
        target = root / folder / name
        if target.exists() or target.is_symlink():
            continue
        if kind == "link-out":
            target.symlink_to(outside / "0123456789abcdef.bin")
        elif kind == "link-dir-out":
            target.symlink_to(outside)
        else:
            plant(target, kind, b"kv")
    with contextlib.suppress(Refused):  # a planted .lock no regular file: nothing deleted
        disk_layout.clear_tier(str(disk))
    assert sorted(p.name for p in outside.rglob("*")) == before


PLANTED = st.sampled_from(["file", "file", "fifo", "dev-zero", "folder"])


@FUZZ
@given(
    content=st.binary(max_size=200) | st.text(max_size=200).map(str.encode),
    kinds=st.tuples(PLANTED, PLANTED),
)
def test_fuzz_the_config_and_api_key_files(content: bytes, kinds: tuple[str, str]) -> None:
    """The other files the manager opens on every poll: config.toml and the API key file
    each answer with a refusal naming them, or a value; never a hang or a traceback."""
    from vllm_offload import launch, launch_spec

    folder = Path(tempfile.mkdtemp(dir=_scratch))
    plant(folder / "config.toml", kinds[0], content)
    plant(folder / "key", kinds[1], content)
    if kinds[1] == "file":
        (folder / "key").chmod(0o600)
    with contextlib.suppress(config_mod.ConfigError):
        config_mod.load(folder / "config.toml")
    keyed = config_mod.with_overrides(
        config_mod.DeploymentConfig(), {"server.api_key_file": str(folder / "key")}
    )
    try:
        assert launch.read_api_key(keyed)
    except launch_spec.PreflightError as exc:
        assert exc.field == "server.api_key_file"
