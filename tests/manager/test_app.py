from __future__ import annotations

import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.manager.conftest import BEARER, TOKEN, Env, login
from vllm_offload import config as config_mod
from vllm_offload import disk_layout
from vllm_offload.manager.auth import SESSION_COOKIE
from vllm_offload.manager.metrics import parse_vllm_metrics

pytestmark = pytest.mark.anyio
ORIGIN = {"Origin": "http://testserver"}
GETS = ["/api/status", "/api/metrics", "/api/models", "/api/config", "/api/logs", "/api/detect"]
UNSAFE = [
    ("post", "/api/service/restart"),
    ("post", "/api/config/preview"),
    ("put", "/api/config"),
    ("post", "/api/probe"),
    ("post", "/api/cache/clear"),
]


async def test_healthz_is_open(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}


@pytest.mark.parametrize("path", GETS)
async def test_every_endpoint_needs_the_token(client: httpx.AsyncClient, path: str) -> None:
    anonymous = await client.get(path)
    assert anonymous.status_code == 401
    assert "Authorization: Bearer" in anonymous.json()["detail"]["message"]
    wrong = await client.get(path, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and "wrong token" in wrong.json()["detail"]["message"]
    assert (await client.get(path, headers=BEARER)).status_code == 200


@pytest.mark.parametrize(("method", "path"), UNSAFE)
async def test_unsafe_endpoints_need_the_token(
    client: httpx.AsyncClient, method: str, path: str
) -> None:
    response = await client.request(method, path, json={"config": {}})
    assert response.status_code == 401


async def test_dashboard_redirects_to_login(client: httpx.AsyncClient) -> None:
    response = await client.get("/")
    assert response.status_code == 303 and response.headers["location"] == "/login"
    assert "Paste the manager token" in (await client.get("/login")).text


async def test_login_sets_a_strict_http_only_cookie(client: httpx.AsyncClient) -> None:
    bad = await client.post("/login", data={"token": "wrong"}, headers=ORIGIN)
    assert bad.status_code == 401 and "not right" in bad.text
    cross = await client.post(
        "/login", data={"token": TOKEN}, headers={"Origin": "http://evil.example"}
    )
    assert cross.status_code == 403
    good = await client.post("/login", data={"token": TOKEN}, headers=ORIGIN)
    assert good.status_code == 303
    cookie = good.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    assert (await client.get("/api/status")).status_code == 200  # the cookie works


async def test_session_writes_need_csrf_and_origin(client: httpx.AsyncClient) -> None:
    csrf = await login(client)
    no_csrf = await client.post("/api/service/restart", headers=ORIGIN)
    assert no_csrf.status_code == 403 and "X-CSRF-Token" in no_csrf.json()["detail"]["message"]
    wrong_origin = await client.post(
        "/api/service/restart", headers={"X-CSRF-Token": csrf, "Origin": "http://evil"}
    )
    assert wrong_origin.status_code == 403 and "Origin" in wrong_origin.json()["detail"]["message"]
    no_origin = await client.post("/api/service/restart", headers={"X-CSRF-Token": csrf})
    assert no_origin.status_code == 403
    ok = await client.post("/api/service/restart", headers={"X-CSRF-Token": csrf, **ORIGIN})
    assert ok.status_code == 200


async def test_logout_ends_the_session(client: httpx.AsyncClient) -> None:
    """The old cookie, sent again after logout (as a stolen copy would be), no longer works;
    the test once cleared the client's cookies first, so it passed whatever /logout did."""
    csrf = await login(client)
    session = client.cookies[SESSION_COOKIE]
    assert (await client.get("/api/status")).status_code == 200
    response = await client.post("/logout", headers={"X-CSRF-Token": csrf, **ORIGIN})
    assert response.status_code == 303
    client.cookies.set(SESSION_COOKIE, session)  # keep the cookie the browser was told to drop
    assert (await client.get("/api/status")).status_code == 401


async def test_start_stop_restart_through_systemctl(client: httpx.AsyncClient) -> None:
    assert (await client.post("/api/service/start", headers=BEARER)).status_code == 200
    first = (await client.get("/api/status", headers=BEARER)).json()
    assert first["active_state"] == "active" and first["pid"]
    assert first["health"] == "starting"  # the unit runs; no server answers on its port
    await client.post("/api/service/restart", headers=BEARER)
    second = (await client.get("/api/status", headers=BEARER)).json()
    assert second["pid"] and second["pid"] != first["pid"]
    await client.post("/api/service/stop", headers=BEARER)
    stopped = (await client.get("/api/status", headers=BEARER)).json()
    assert stopped["health"] == "stopped" and stopped["pid"] is None
    events = [e["text"] for e in stopped["events"]]
    assert f"new server process: pid {first['pid']} -> {second['pid']}" in events
    assert f"server process {second['pid']} is gone" in events
    assert "starting -> stopped" in events
    bad = await client.post("/api/service/reboot", headers=BEARER)
    assert bad.status_code == 422


async def test_status_shows_model_and_plan(client: httpx.AsyncClient) -> None:
    status = (await client.get("/api/status", headers=BEARER)).json()
    assert status["model"].endswith("demo-a") and status["served_name"] == "demo-a"
    assert status["plan"]["architecture"] == "LlamaForCausalLM"


async def test_models_are_listed_from_the_roots(client: httpx.AsyncClient, env: Env) -> None:
    body = (await client.get("/api/models", headers=BEARER)).json()
    assert body["roots"] == [str(env.models)]
    assert [m["name"] for m in body["models"]] == ["demo-a", "demo-b"]
    # A folder whose name holds a newline (it forged journal lines as a model's name, #37)
    forged = env.models / "m\nvllm-offload: switched to 'x'"
    shutil.copytree(env.models / "demo-a", forged)
    try:
        body = (await client.get("/api/models", headers=BEARER)).json()
        assert [m["name"] for m in body["models"]] == ["demo-a", "demo-b"]
        refused = await put_config(client, model__path=str(forged))
        assert refused.status_code == 422 and "control character" in refused.text
    finally:
        shutil.rmtree(forged)


async def put_config(client: httpx.AsyncClient, **changes: object) -> httpx.Response:
    config = (await client.get("/api/config", headers=BEARER)).json()["config"]
    for dotted, value in changes.items():
        section, _, key = dotted.rpartition("__")
        (config[section] if section else config)[key] = value
    return await client.put("/api/config", json={"config": config}, headers=BEARER)


@pytest.mark.parametrize(
    ("changes", "status", "field", "words"),
    [
        ({"gpu__memory_utilization": 2}, 422, "gpu.memory_utilization", "less than or equal to 1"),
        ({"server__port": "http"}, 422, "server.port", "valid integer"),
        ({"model__max_model_len": 10**8}, 422, "model.max_model_len", "past the model's limit"),
        ({"model__path": "/etc"}, 422, "model.path", "outside the model roots"),
        ({"kv_offload__swap_space": 4}, 422, "kv_offload", "kv_offload.cpu_tier_gib"),
        ({"kv_offload__backend": "native"}, 409, "kv_offload.backend", "needs an NVIDIA GPU"),
        ({"extra_args": ["--port", "9"]}, 422, "extra_args", "from server.port"),
    ],
)
async def test_invalid_config_is_refused_and_nothing_is_written(
    client: httpx.AsyncClient,
    env: Env,
    changes: dict[str, object],
    status: int,
    field: str,
    words: str,
) -> None:
    before = env.config_path.read_bytes()
    response = await put_config(client, **changes)
    assert response.status_code == status
    detail = response.json()["detail"]
    assert detail["field"] == field and words in detail["message"], detail
    assert env.config_path.read_bytes() == before
    assert not env.config_path.with_suffix(".toml.bak").exists()


async def test_symlink_out_of_the_roots_is_refused(
    client: httpx.AsyncClient, env: Env, tmp_path: Path, demo_dir: Path
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (env.models / "sneaky").symlink_to(outside)
    response = await put_config(client, model__path=str(env.models / "sneaky"))
    assert response.status_code == 422
    assert "outside the model roots" in response.json()["detail"]["message"]


async def test_save_writes_atomically_keeps_a_backup_and_restarts(
    client: httpx.AsyncClient, env: Env
) -> None:
    await client.post("/api/service/start", headers=BEARER)
    pid = (await client.get("/api/status", headers=BEARER)).json()["pid"]
    before = env.config_path.read_bytes()
    preview = await client.post(
        "/api/config/preview",
        headers=BEARER,
        json={
            "config": {
                **config_mod.load(env.config_path).model_dump(),
                "model": {"path": str(env.models / "demo-b")},
            }
        },
    )
    assert preview.status_code == 200 and preview.json()["plan"]["model_path"].endswith("demo-b")
    response = await put_config(client, model__path=str(env.models / "demo-b"))
    assert response.status_code == 202
    assert config_mod.load(env.config_path).model.path == str(env.models / "demo-b")
    assert env.config_path.with_suffix(".toml.bak").read_bytes() == before
    after = (await client.get("/api/status", headers=BEARER)).json()
    assert after["pid"] and after["pid"] != pid


async def test_huge_body_is_refused(client: httpx.AsyncClient) -> None:
    response = await client.put("/api/config", headers=BEARER, content=b"{" + b" " * 100_000 + b"}")
    assert response.status_code == 413
    assert "larger than 65536 bytes" in response.json()["detail"]["message"]


async def test_huge_chunked_body_is_refused_and_nothing_changes(
    client: httpx.AsyncClient, env: Env
) -> None:
    before = env.config_path.read_bytes()
    config = config_mod.load(env.config_path).model_dump()
    config["extra_args"] = ["--seed=1"] * 20_000  # valid JSON, a valid config, ~220 KB

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: read until too much
        body = json.dumps({"config": config}).encode()
        for start in range(0, len(body), 16_384):
            yield body[start : start + 16_384]

    headers = {**BEARER, "Content-Type": "application/json"}
    response = await client.put("/api/config", headers=headers, content=chunks())
    assert response.status_code == 413, response.text[:300]
    assert "larger than 65536 bytes" in response.json()["detail"]["message"]
    assert env.config_path.read_bytes() == before


async def test_logs_bounds(client: httpx.AsyncClient) -> None:
    assert (await client.get("/api/logs?lines=0", headers=BEARER)).status_code == 422
    assert (await client.get("/api/logs?lines=99999", headers=BEARER)).status_code == 422


async def test_metrics_samples(client: httpx.AsyncClient) -> None:
    app = client._transport.app  # type: ignore[attr-defined]
    app.state.manager.sampler.sample_once()
    samples = (await client.get("/api/metrics?since=0", headers=BEARER)).json()["samples"]
    assert len(samples) == 1
    assert 0 <= samples[0]["cpu_percent"] <= 100 and samples[0]["ram_total_bytes"] > 0
    later = (await client.get(f"/api/metrics?since={samples[0]['t']}", headers=BEARER)).json()
    assert later["samples"] == []


async def test_probe_without_server_says_start_it(client: httpx.AsyncClient) -> None:
    response = await client.post("/api/probe", headers=BEARER)
    assert response.status_code == 409
    assert "not running or not healthy" in response.json()["detail"]["message"]


async def test_openapi_schema_lists_the_api(client: httpx.AsyncClient) -> None:
    paths = (await client.get("/openapi.json")).json()["paths"]
    assert {"/api/status", "/api/config", "/api/service/{action}", "/api/logs"} <= set(paths)


def test_vllm_metrics_parser() -> None:
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="m"} 3.0\n'
        "# TYPE vllm:external_prefix_cache_hits counter\n"
        'vllm:external_prefix_cache_hits_total{model_name="m"} 512.0\n'
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        'vllm:time_to_first_token_seconds_sum{model_name="m"} 1.5\n'
        'vllm:time_to_first_token_seconds_count{model_name="m"} 3.0\n'
    )
    values = parse_vllm_metrics(text)
    assert values["vllm:num_requests_running"] == 3.0
    assert values["vllm:external_prefix_cache_hits"] == 512.0
    assert values["vllm:time_to_first_token_seconds_sum"] == 1.5


def test_cli_refuses_non_loopback_without_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from vllm_offload.cli import main

    config = tmp_path / "c.toml"
    config.write_text("")
    assert main(["manager", "--host", "0.0.0.0", "--config", str(config)]) == 2
    assert "refusing to listen beyond loopback without a token" in capsys.readouterr().err
    short = tmp_path / "t"
    short.write_text("abc")
    os.chmod(short, 0o600)
    assert main(["manager", "--token-file", str(short), "--config", str(config)]) == 2
    assert "at least 16 characters" in capsys.readouterr().err
    writable = tmp_path / "w"
    writable.write_text("a-long-enough-token-0123456789")
    os.chmod(writable, 0o666)  # issue #15: accepted without a word
    assert main(["manager", "--token-file", str(writable), "--config", str(config)]) == 2
    assert "other users can read or write it" in capsys.readouterr().err
    os.chmod(writable, 0o644)  # issue #29: readable by every local user, accepted
    assert main(["manager", "--token-file", str(writable), "--config", str(config)]) == 2
    assert "other users can read or write it (mode 644)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "field", "words"),
    [
        ("[gpu]\nmemory_utilization = 7\n", "gpu.memory_utilization", "less than or equal"),
        ("[model\n", "config.toml", "not valid TOML"),
    ],
)
async def test_invalid_config_file_refuses_to_start_the_server(
    client: httpx.AsyncClient, env: Env, content: str, field: str, words: str
) -> None:
    env.config_path.write_text(content)
    response = await client.post("/api/service/start", headers=BEARER)
    assert response.status_code == 409
    detail = response.json()["detail"]
    assert detail["field"].endswith(field) and words in detail["message"]
    assert detail["message"].endswith("(not starting the server)")
    status = await client.get("/api/status", headers=BEARER)
    assert status.status_code == 409  # the page shows why, too
    assert env.systemd.status("vllm").active_state != "active"


async def test_unreadable_config_refuses_to_start(client: httpx.AsyncClient, env: Env) -> None:
    env.config_path.unlink()
    env.config_path.mkdir()  # a directory where the file should be: reading it fails
    response = await client.post("/api/service/restart", headers=BEARER)
    assert response.status_code == 409
    assert "cannot read the config file" in response.json()["detail"]["message"]


async def test_the_sampler_follows_a_port_saved_from_the_page(
    client: httpx.AsyncClient, env: Env
) -> None:
    """Issue #14: after a port change from the page the sampler (and the probe) kept
    asking the old port, so the health stayed at 'starting'."""
    import http.server
    import threading

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            pass

    stand_in = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=stand_in.serve_forever, daemon=True).start()
    try:
        sampler = client._transport.app.state.manager.sampler  # type: ignore[attr-defined]
        assert not sampler.probe_health()  # the configured port 1: nothing there
        response = await put_config(client, server__port=stand_in.server_address[1])
        assert response.status_code == 202, response.text
        assert sampler.server_url == f"http://127.0.0.1:{stand_in.server_address[1]}"
        assert sampler.probe_health()
    finally:
        stand_in.shutdown()


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"manager__model_roots": ["/"]}, "manager.model_roots"),
        ({"manager__api_extra_args": ["--trust-remote-code"]}, "manager.api_extra_args"),
        # The whole [manager] section is the file's (#37's re-read: these went through)
        ({"manager__restart_wedged": True}, "manager.restart_wedged"),
        ({"manager__wedge_after_s": 10}, "manager.wedge_after_s"),
        ({"server__host": "0.0.0.0"}, "server.host"),
        ({"server__api_key_file": "/etc/shadow"}, "server.api_key_file"),
        ({"kv_offload__disk_path": "/etc"}, "kv_offload.disk_path"),  # written, cleared
        ({"extra_args": ["--trust-remote-code"]}, "extra_args"),
        ({"extra_args": ["--trust-remote"]}, "extra_args"),  # vLLM takes the abbreviation
        ({"extra_args": ["--chat-template", "/etc/passwd"]}, "extra_args"),
        ({"extra_args": ["--middleware", "evil.mod"]}, "extra_args"),
        ({"extra_args": ["--ssl-keyfile=/tmp/k"]}, "extra_args"),
        # Issue #44: the router's boxes are where every request goes.
        ({"cluster__router_host": "0.0.0.0"}, "cluster.router_host"),
        (
            {"cluster__boxes": [{"name": "x", "url": "http://evil:80", "models": ["m"]}]},
            "cluster.boxes",
        ),
    ],
)
async def test_the_api_cannot_widen_its_own_fence(
    client: httpx.AsyncClient, env: Env, changes: dict[str, object], field: str
) -> None:
    """Issue #15: a valid token is not a licence to run code. model_roots = ["/"] made
    any path "inside"; extra_args passed --trust-remote-code and --host 0.0.0.0."""
    before = env.config_path.read_bytes()
    for path, method in (("/api/config/preview", "POST"), ("/api/config", "PUT")):
        config = (await client.get("/api/config", headers=BEARER)).json()["config"]
        for dotted, value in changes.items():
            section, _, key = dotted.rpartition("__")
            (config[section] if section else config)[key] = value
        response = await client.request(method, path, json={"config": config}, headers=BEARER)
        assert response.status_code == 403, response.text
        detail = response.json()["detail"]
        assert detail["field"] == field and "administrator" in detail["message"], detail
    assert env.config_path.read_bytes() == before


async def test_tuning_flags_and_what_the_administrator_allowed_pass(
    client: httpx.AsyncClient, env: Env
) -> None:
    assert (await put_config(client, extra_args=["--max-num-seqs", "8"])).status_code == 202
    refused = await put_config(client, extra_args=["--trust-remote-code"])
    assert refused.status_code == 403
    saved = config_mod.load(env.config_path)
    config_mod.save(
        config_mod.with_overrides(saved, {"manager.api_extra_args": ["--trust-remote-code"]}),
        env.config_path,
    )
    assert (await put_config(client, extra_args=["--trust-remote-code"])).status_code == 202


async def test_start_and_save_refuse_what_serve_refuses(
    client: httpx.AsyncClient, env: Env
) -> None:
    """Issue #14: the manager ran no preflight and no API-key read, so it saved and started
    configs `serve` refuses; the unit then only showed a crash loop."""
    saved = config_mod.load(env.config_path)
    config_mod.save(
        config_mod.with_overrides(saved, {"server.api_key_file": "/nonexistent/key"}),
        env.config_path,
    )
    start = await client.post("/api/service/start", headers=BEARER)
    assert start.status_code == 409
    assert start.json()["detail"]["field"] == "server.api_key_file"
    assert "cannot read /nonexistent/key" in start.json()["detail"]["message"]
    save = await put_config(client, gpu__memory_utilization=0.8)
    assert save.status_code == 409 and save.json()["detail"]["field"] == "server.api_key_file"
    assert env.systemd.status("vllm").active_state != "active"


FAKE_SERVER = """
import http.server, os, socket, sys
socket.getfqdn("127.0.0.1")  # loads what it loads now: nobody cannot read root's Python
if len(sys.argv) > 1:
    os.setgid(65534); os.setuid(65534)  # nobody: another local user
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def do_POST(self):
        print("AUTH", self.headers.get("Authorization"), flush=True)
        self.send_response(404); self.end_headers()
    def log_message(self, *a): pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""


@pytest.mark.parametrize("as_another_user", [True, False])
async def test_the_probe_sends_the_api_key_only_to_the_units_server(
    client: httpx.AsyncClient, env: Env, tmp_path: Path, as_another_user: bool
) -> None:
    """Issue #15: a local user listening on the server's port (the unit stopped or not
    yet up) was sent the API key and could fake 'healthy'."""
    import subprocess
    import sys

    another = ["nobody"] if as_another_user else []
    fake = subprocess.Popen(
        [sys.executable, "-c", FAKE_SERVER, *another], stdout=subprocess.PIPE, text=True
    )
    try:
        assert fake.stdout is not None
        port = int(fake.stdout.readline())
        key = tmp_path / "key"
        key.write_text("the-key")
        key.chmod(0o600)
        saved = config_mod.load(env.config_path)
        config_mod.save(
            config_mod.with_overrides(
                saved, {"server.port": port, "server.api_key_file": str(key)}
            ),
            env.config_path,
        )
        assert (await client.post("/api/service/start", headers=BEARER)).status_code == 200
        response = await client.post("/api/probe", headers=BEARER)
        fake.terminate()
        seen = fake.communicate(timeout=30)[0]
        if as_another_user:
            assert response.status_code == 409, response.text
            assert response.json()["detail"]["field"] == "server.port"
            assert "the-key" not in seen
        else:  # the unit's own user: the key goes (this stand-in cannot chat: 502)
            assert response.status_code == 502 and "AUTH Bearer the-key" in seen
    finally:
        fake.kill()


async def test_a_save_on_a_stale_copy_is_refused(client: httpx.AsyncClient, env: Env) -> None:
    """Issue #15: two pages saving at once silently kept the last one. The page sends the
    ETag it loaded as If-Match; a save on a copy that changed since is 409."""
    loaded = await client.get("/api/config", headers=BEARER)
    tag = loaded.json()["etag"]
    assert loaded.headers["etag"] == tag
    config = loaded.json()["config"]
    config["gpu"]["memory_utilization"] = 0.8
    first = await client.put(
        "/api/config", json={"config": config}, headers={**BEARER, "If-Match": tag}
    )
    assert first.status_code == 202, first.text
    saved = env.config_path.read_bytes()
    config["gpu"]["memory_utilization"] = 0.7
    second = await client.put(
        "/api/config", json={"config": config}, headers={**BEARER, "If-Match": tag}
    )
    assert second.status_code == 409 and "changed since you loaded it" in second.text
    assert env.config_path.read_bytes() == saved


async def test_guessing_the_token_is_limited(client: httpx.AsyncClient) -> None:
    for _ in range(10):
        wrong = await client.post("/login", data={"token": "guess"}, headers=ORIGIN)
        assert wrong.status_code == 401
    right = await client.post("/login", data={"token": TOKEN}, headers=ORIGIN)
    assert right.status_code == 429  # even the right token, for the next minute


async def test_no_page_loads_code_from_elsewhere(client: httpx.AsyncClient) -> None:
    assert (await client.get("/docs")).status_code == 404  # Swagger UI came from a CDN
    assert (await client.get("/openapi.json")).status_code == 200


def test_temp_files_a_killed_save_left_are_swept_at_start(env: Env) -> None:
    from vllm_offload.manager import ManagerSettings, create_app

    leftover = env.config_path.parent / f".{env.config_path.name}.k1ll3d"
    leftover.write_text("half a config")
    create_app(
        ManagerSettings(config_path=env.config_path, token=TOKEN, unit="vllm", systemd=env.systemd)
    )
    assert not leftover.exists() and env.config_path.exists()


async def test_the_logs_say_when_the_journal_is_out_of_reach(
    client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #15: a manager user outside systemd-journal saw an empty Logs card and no
    reason why the server stopped; the page now says what to do."""
    from vllm_offload.manager.routes import status as status_routes

    monkeypatch.setattr(status_routes.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(status_routes.os, "getgroups", lambda: [1000])
    lines = (await client.get("/api/logs", headers=BEARER)).json()["lines"]
    assert lines == [status_routes.JOURNAL_HINT] and "systemd-journal group" in lines[0]


async def test_clearing_the_disk_tier(client: httpx.AsyncClient, env: Env, tmp_path: Path) -> None:
    """#20: the page's button does what `cache clear` does: 409 without a disk tier or while
    a server holds it, and with a session it needs the CSRF token like every write."""
    nothing = await client.post("/api/cache/clear", headers=BEARER)
    assert nothing.status_code == 409
    assert nothing.json()["detail"]["field"] == "kv_offload.disk_path"
    disk = tmp_path / "nvme"
    tier = disk_layout.tier_root(str(disk))
    block = tier / "fingerprint" / "m_0123456789ab_r0" / "abc" / "de_g0" / f"{'ab' * 32}.bin"
    block.parent.mkdir(parents=True)
    block.write_bytes(b"kv" * 512)
    config = config_mod.load(env.config_path)  # the administrator sets the path, in the file
    config_mod.save(
        config_mod.with_overrides(config, {"kv_offload.disk_path": str(disk)}), env.config_path
    )
    server = disk_layout.hold(tier)  # a running server's disk tier
    try:
        busy = await client.post("/api/cache/clear", headers=BEARER)
        assert busy.status_code == 409 and "running server" in busy.json()["detail"]["message"]
        assert block.exists()
    finally:
        os.close(server)
    csrf = await login(client)
    refused = await client.post("/api/cache/clear", headers=ORIGIN)
    assert refused.status_code == 403 and block.exists()
    done = await client.post("/api/cache/clear", headers={"X-CSRF-Token": csrf, **ORIGIN})
    assert done.json() == {"files": 1, "bytes": 1024} and not block.exists()


async def test_the_tier_card_says_lmcache_feeds_no_counters(
    client: httpx.AsyncClient, env: Env
) -> None:
    """#21: with the lmcache backend the CPU-tier card does not show zeros from counters
    only vLLM's own tier feeds; it says why it is empty."""
    from vllm_offload.manager.routes import status as status_routes

    config = config_mod.load(env.config_path)
    config_mod.save(
        config_mod.with_overrides(config, {"kv_offload.backend": "lmcache"}), env.config_path
    )
    tier = (await client.get("/api/status", headers=BEARER)).json()["tier"]
    assert tier == {"available": False, "why": status_routes.LMCACHE_CARD}
