"""schemathesis against the manager's own OpenAPI schema, with and without the token:
no 5xx, every 4xx body says what is wrong, and no rejected request changes anything."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.manager.conftest import TOKEN, UNIT
from vllm_offload import config as config_mod
from vllm_offload import demo_model
from vllm_offload.manager import ManagerSettings, create_app
from vllm_offload.systemd.control import Systemd

BIN = Path(sys.executable).parent
_scratch = Path(__import__("tempfile").mkdtemp(prefix="manager-fuzz-"))
_models = _scratch / "models"
demo_model.write(_models / "demo")
CONFIG = _scratch / "etc" / "config.toml"
config_mod.save(config_mod.with_overrides(config_mod.DeploymentConfig(), {
    "model.path": str(_models / "demo"), "manager.model_roots": [str(_models)],
    "server.port": 1,
}), CONFIG)  # fmt: skip
_root = _scratch / "a" / "b" / "root"
(_root / "etc/systemd/system").mkdir(parents=True)
(_root / "etc/systemd/system/vllm.service").write_text(UNIT)
APP = create_app(ManagerSettings(CONFIG, TOKEN, "vllm", Systemd(
    (str(BIN / "systemctl3"),), (str(BIN / "journalctl3"),), _root)))  # fmt: skip
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


RISKY_FLAGS = ["--trust-remote-code", "--trust-remote", "--chat-template", "--middleware",
               "--ssl-keyfile", "--allowed-local-media-path", "--tool-parser-plugin",
               "--host", "--model", "--port", "--max-model-len", "--api-key"]  # fmt: skip


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
        response = client.put("/api/config", json={"config": config},
                              headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip
    assert response.status_code in (403, 422), response.text
    check(response, before)
