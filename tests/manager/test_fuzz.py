"""schemathesis against the manager's own OpenAPI schema, with and without the token:
no 5xx, every 4xx body says what is wrong, and no rejected request changes anything."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

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
