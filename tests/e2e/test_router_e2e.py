"""More than one box (issue #44), on loopback: SGLang's router (``smg``, installed from PyPI by
the test extra) in front of two real ``vllm-offload serve`` processes standing for two boxes.
Box A serves ``chat`` alone (vLLM's own server); box B serves ``chat`` and ``coder`` behind
its front door (on a CPU one model runs at a time, so asking B for the other is a switch).
The router runs as its unit would (``cluster_router``, from a config's ``[cluster]``); the
manifest it writes has one entry per (box, model), so a request reaches only a box that
serves its model. Each box is told apart by its own
/metrics (prompt tokens, counted per box)."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from testkit.server import VLLM_OFFLOAD, server_env
from vllm_offload import cluster_router
from vllm_offload.bench.server_process import free_port
from vllm_offload.config import ClusterBox, ClusterSection, DeploymentConfig, parse, save
from vllm_offload.upstream.client import VllmClient, wait_until
from vllm_offload.upstream.metrics import GPU_PREFIX_HITS, PROMPT_TOKENS

pytestmark = pytest.mark.e2e
START_S = 600  # two boxes' engines starting at once on a busy 2-core box
KEY = "router-e2e-key"


@dataclass(kw_only=True)
class Box:
    name: str
    config: Path
    port: int
    scratch: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        log = (self.scratch / f"{self.name}.log").open("ab")
        self.proc = subprocess.Popen(
            [VLLM_OFFLOAD, "serve", "--config", str(self.config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=server_env(self.scratch),
            start_new_session=True,
        )

    def wait_healthy(self) -> None:
        proc = self.proc
        assert proc is not None
        try:
            with VllmClient(self.url) as server:
                server.wait_healthy(START_S, alive=lambda: proc.poll() is None)
        except (RuntimeError, TimeoutError) as exc:
            log = (self.scratch / f"{self.name}.log").read_text(errors="replace")
            raise RuntimeError(f"box {self.name}: {exc}:\n{log[-6000:]}") from None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=180)

    def prompt_tokens(self) -> float:
        """Prompt tokens this box has prefilled (every model on it); 0 while it is down."""
        if self.proc is None or self.proc.poll() is not None:
            return 0.0
        with VllmClient(self.url, api_key=KEY) as server:
            return server.metrics([PROMPT_TOKENS]).get(PROMPT_TOKENS, 0.0)

    def prefix_hits(self) -> float:
        with VllmClient(self.url, api_key=KEY) as server:
            return server.metrics([GPU_PREFIX_HITS]).get(GPU_PREFIX_HITS, 0.0)


@dataclass(kw_only=True)
class Cluster:
    a: Box
    b: Box
    router: subprocess.Popen[bytes]
    url: str
    log: Path

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, timeout=START_S)

    def served_by(self, model: str, prompt: str) -> str:
        """Which box prefilled ``prompt`` (asked through the router)."""
        before = {box.name: box.prompt_tokens() for box in (self.a, self.b)}
        answer = self.client().completions.create(model=model, prompt=prompt, max_tokens=2)
        assert answer.model == model
        grew = [box.name for box in (self.a, self.b) if box.prompt_tokens() > before[box.name]]
        assert len(grew) == 1, (model, grew)
        return grew[0]

    def workers(self) -> dict[tuple[str, str], bool]:
        """The router's view: (address, model) -> healthy."""
        headers = {"Authorization": f"Bearer {KEY}"}
        found = httpx.get(self.url + "/workers", headers=headers, timeout=30).json()
        return {(w["url"], w["model_id"]): bool(w["is_healthy"]) for w in found["workers"]}


def every_worker(a: Box, b: Box) -> list[tuple[str, str]]:
    return [(a.url, "chat"), (b.url, "chat"), (f"http://localhost:{b.port}", "coder")]


def answers(cluster: Cluster) -> bool:
    try:
        return httpx.get(cluster.url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def box_config(scratch: Path, port: int, key_file: Path, models: list[str]) -> Path:
    data: dict[str, Any] = {
        "extra_args": ["--enforce-eager"],
        "gpu": {"kv_cache_memory_bytes": 64 << 20},
        "server": {"port": port, "api_key_file": str(key_file)},
    }
    if len(models) == 1:
        data["model"] = {"served_name": models[0]}
    else:
        data["models"] = [{"served_name": name} for name in models]
        data["residency"] = {"runtime_dir": str(scratch / "run"), "min_resident_s": 1.0}
    path = scratch / "config.toml"
    save(parse(data), path)
    return path


def cluster_section(a: Box, b: Box, key_file: Path) -> ClusterSection:
    # Box B twice under two spellings of its address: smg takes one model per address.
    return ClusterSection(
        router_host="127.0.0.1",
        router_port=free_port(),
        metrics_port=free_port(),
        api_key_file=str(key_file),
        health_check_interval_s=1,
        boxes=[
            ClusterBox(name="a", url=a.url, models=["chat"]),
            ClusterBox(
                name="b",
                url=b.url,
                models=["chat", "coder"],
                model_urls={"coder": f"http://localhost:{b.port}"},
            ),
        ],
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    scratch = tmp_path_factory.mktemp("router")
    key_file = scratch / "api-key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    boxes = []
    for name, models in (("a", ["chat"]), ("b", ["chat", "coder"])):
        home = scratch / name
        home.mkdir()
        port = free_port()
        boxes.append(
            Box(name=name, config=box_config(home, port, key_file, models), port=port, scratch=home)
        )
    a, b = boxes
    log = scratch / "router.log"
    router: subprocess.Popen[bytes] | None = None
    try:
        for box in boxes:
            box.start()
        for box in boxes:
            box.wait_healthy()
        section = cluster_section(a, b, key_file)
        config = scratch / "router" / "config.toml"
        save(DeploymentConfig(cluster=section), config)
        manifest = scratch / "router" / "workers.json"
        with log.open("wb") as out:
            router = subprocess.Popen(
                cluster_router.command(sys.executable, config, manifest),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        found = Cluster(
            a=a, b=b, router=router, url=f"http://127.0.0.1:{section.router_port}", log=log
        )
        alive = router.poll
        wait_until(lambda: alive() is None and answers(found), 120, "the router")
        everyone = dict.fromkeys(every_worker(a, b), True)
        wait_until(lambda: found.workers() == everyone, 120, "the router to see both boxes")
        yield found
    except (httpx.HTTPError, TimeoutError) as exc:
        raise RuntimeError(f"{exc}:\n{log.read_text(errors='replace')[-6000:]}") from None
    finally:
        if router is not None:
            router.send_signal(signal.SIGTERM)
            router.wait(timeout=60)
        for box in boxes:
            box.stop()


def test_the_router_lists_every_model_of_every_box(cluster: Cluster) -> None:
    assert sorted(m.id for m in cluster.client().models.list()) == ["chat", "coder"]


def test_the_api_key_is_checked_end_to_end(cluster: Cluster) -> None:
    ask = {"model": "chat", "prompt": "hi", "max_tokens": 1}
    for key in ("wrong", None):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        refused = httpx.post(cluster.url + "/v1/completions", json=ask, headers=headers)
        assert refused.status_code == 401, refused.text
    answer = cluster.client().completions.create(model="chat", prompt="hi", max_tokens=1)
    assert answer.usage is not None and answer.usage.completion_tokens == 1
    with VllmClient(cluster.a.url) as box:  # the boxes check it too: no way around the router
        assert box.post("/v1/completions", ask).status_code == 401


def test_the_same_long_prefix_goes_to_the_same_box(cluster: Cluster) -> None:
    """Cache-aware routing: a conversation's turns land where its prefix is cached, so the
    box's prefix cache (and CPU tier) hits survive the router."""
    for topic in ("rivers", "mountains"):
        prefix = f"A long shared document about {topic}. " + " ".join(
            f"{topic} fact {i}." for i in range(120)
        )
        hits_before = {box.name: box.prefix_hits() for box in (cluster.a, cluster.b)}
        where = {cluster.served_by("chat", f"{prefix} Question {q}?") for q in range(4)}
        assert len(where) == 1, where
        (name,) = where
        box = cluster.a if name == "a" else cluster.b
        assert box.prefix_hits() > hits_before[name]  # turns 2-4 reused turn 1's prefix


def test_streaming_passes_through(cluster: Cluster) -> None:
    stream = cluster.client().chat.completions.create(
        model="chat",
        messages=[{"role": "user", "content": "count"}],
        max_tokens=24,
        stream=True,
        temperature=0,
        extra_body={"ignore_eos": True},
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    pieces = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) >= 10  # piece by piece, not one answer at the end
    usage = [c.usage for c in chunks if c.usage is not None]
    assert usage and usage[-1].completion_tokens == 24


def test_a_box_going_down_is_routed_around_and_comes_back(cluster: Cluster) -> None:
    a_chat = (cluster.a.url, "chat")
    cluster.a.stop()
    for i in range(4):  # at once: requests that meet the dead box are retried on the other
        assert cluster.served_by("chat", f"while a is down {i}") == "b"
    wait_until(lambda: not cluster.workers()[a_chat], 60, "the router to mark box a down")
    cluster.a.start()
    cluster.a.wait_healthy()
    wait_until(lambda: cluster.workers()[a_chat], 60, "the router to take box a back")
    # Prompts sharing nothing, so cache-aware routing is free to pick either box.
    served = [cluster.served_by("chat", f"{uuid.uuid4().hex} {i}") for i in range(12)]
    assert "a" in served, served


def test_a_model_on_one_box_only_is_asked_there(cluster: Cluster) -> None:
    """coder is on box B only: the router never sends it to A (A would answer 404), and
    asking for it switches B's engine on this CPU host."""
    a_before = cluster.a.prompt_tokens()
    answer = cluster.client().completions.create(model="coder", prompt="x", max_tokens=3)
    assert answer.model == "coder"
    assert cluster.a.prompt_tokens() == a_before
    with pytest.raises(openai.NotFoundError) as info:
        cluster.client().completions.create(model="gpt-4", prompt="x", max_tokens=1)
    assert "gpt-4" in str(info.value)
