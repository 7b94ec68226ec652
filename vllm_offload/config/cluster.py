"""More than one box: ``[cluster]`` lists the vllm-offload boxes behind one router (SGLang's
``smg``, docs/several-boxes.md) and which models each serves. The router's files and command
line are written from it (``cluster_router``); nothing here reaches vLLM.

smg 1.13 routes each model to the addresses registered for it and takes one model per
address, so a box serving several models is listed once per model, each under its own
spelling of the box's address (``model_urls``).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from vllm_offload.config.sections import _Section, check_host

# http://host:port with nothing after it: the router appends the OpenAI paths itself, and
# the front door matches them byte for byte (a trailing slash would make //v1/...).
BOX_URL = re.compile(r"https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):[0-9]{1,5}")
BOX_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")


def check_box_url(url: str) -> str:
    if not BOX_URL.fullmatch(url) or not 1 <= int(url.rsplit(":", 1)[1]) <= 65535:
        raise ValueError(
            f"'{url}' is not http://host:port (no path, no trailing slash); "
            "e.g. http://10.0.0.2:8000"
        )
    return url


class ClusterBox(_Section):
    name: str = Field(description="The box's short name (a-z, 0-9, -), e.g. 'gpu1'.")
    url: str = Field(description="The box's OpenAI address as the router reaches it.")
    models: list[str] = Field(
        min_length=1, description="Served names of the models this box serves."
    )
    model_urls: dict[str, str] = Field(
        default_factory=dict,
        description="For a box with several models: each model after the first under "
        "another spelling of the box's address (its IP address, another DNS name), since "
        "the router takes one model per address.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not BOX_NAME.fullmatch(name):
            raise ValueError(f"'{name}': use a-z, 0-9 and -, at most 32 characters")
        return name

    @field_validator("url")
    @classmethod
    def _url(cls, url: str) -> str:
        return check_box_url(url)

    @field_validator("model_urls")
    @classmethod
    def _model_urls(cls, urls: dict[str, str]) -> dict[str, str]:
        for url in urls.values():
            check_box_url(url)
        return urls

    def addresses(self) -> dict[str, str]:
        """Each model's address on this box: the first model's is ``url``."""
        return {
            m: self.model_urls.get(m, self.url) if i else self.url
            for i, m in enumerate(self.models)
        }


class ClusterSection(_Section):
    boxes: list[ClusterBox] = Field(
        default_factory=list,
        description="The boxes behind the router ([[cluster.boxes]]: name, url, models, "
        "model_urls). Empty: one box, no router. Set in the file only.",
    )
    router_host: str = Field(
        "127.0.0.1",
        description="Address the router listens on (0.0.0.0: every interface, for clients "
        "on other machines).",
    )
    router_port: int = Field(8100, ge=1, le=65535, description="Port the router listens on.")
    metrics_host: str = Field(
        "127.0.0.1",
        description="Address the router's Prometheus metrics listen on; they take no key, "
        "so they stay on this machine unless a scraper elsewhere needs them (issue #55: "
        "they followed router_host onto every interface).",
    )
    metrics_port: int = Field(
        29100, ge=1, le=65535, description="Port of the router's Prometheus metrics."
    )
    api_key_file: str = Field(
        "",
        description="File holding the key clients send the router; it checks the key and "
        "passes it on, so each box's server.api_key_file must hold the same key. Empty: "
        "no key (then the boxes must have none either).",
    )
    policy: Literal["cache_aware", "prefix_hash", "round_robin", "power_of_two", "random"] = Field(
        "cache_aware",
        description="How the router picks among the boxes serving a model: "
        "'cache_aware' sends a prompt where its longest prefix went before (so each "
        "box's prefix cache and CPU tier keep their hits) unless the boxes' loads "
        "drift apart; the others are smg's own policies.",
    )
    health_check_interval_s: int = Field(
        5,
        ge=1,
        le=3600,
        description="Seconds between the router's /health probes of each box; a box that "
        "fails one is routed around until one succeeds.",
    )

    _host = field_validator("router_host", "metrics_host")(check_host)

    @model_validator(mode="after")
    def _one_model_per_address(self) -> ClusterSection:
        names = [box.name for box in self.boxes]
        owner: dict[str, str] = {}
        for i, box in enumerate(self.boxes):
            if names.count(box.name) > 1:
                raise ValueError(f"boxes[{i}].name: '{box.name}' names two boxes")
            for model in box.model_urls:
                if model not in box.models[1:]:
                    raise ValueError(
                        f"boxes[{i}].model_urls: '{model}' is not one of this box's models "
                        f"after the first ({', '.join(box.models[1:]) or 'none'})"
                    )
            for model, url in box.addresses().items():
                if url in owner:
                    raise ValueError(
                        f"boxes[{i}].model_urls: {url} already carries {owner[url]}; smg "
                        f"takes one model per address: give '{model}' another spelling of "
                        f"this box's address, e.g. model_urls = {{ {model} = "
                        f'"http://<its IP address>:<port>" }}'
                    )
                owner[url] = f"'{model}' of box {box.name}"
        return self
