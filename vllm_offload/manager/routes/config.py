"""The config through the API: read it (with its ETag), preview a change's plan, save it
(then the server restarts), and list the model folders one may choose. Every body is
untrusted input: valid, inside the fence the saved file sets, startable here."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Response
from pydantic import BaseModel

from vllm_offload import config as config_mod
from vllm_offload.box.prepare import PreparedBox
from vllm_offload.config import DeploymentConfig
from vllm_offload.deployment import list_models, model_roots
from vllm_offload.errors import Refused, StorageFull
from vllm_offload.manager import bounded, fence
from vllm_offload.manager.fence import allowed
from vllm_offload.manager.reach import server_url
from vllm_offload.manager.state import AnyPrepared, Manager, manager_of
from vllm_offload.model import hub
from vllm_offload.plan.box_render import box_json
from vllm_offload.systemd.control import ServiceError

router = APIRouter()
Shared = Annotated[Manager, Depends(manager_of)]


class ConfigBody(BaseModel):
    config: dict[str, Any]


def plan_of(prepared: AnyPrepared) -> dict[str, Any]:
    if isinstance(prepared, PreparedBox):
        return box_json(prepared.plan)
    return prepared.plan.to_json()


def from_api(manager: Manager, body: ConfigBody) -> tuple[DeploymentConfig, DeploymentConfig]:
    """A config sent to the API, valid and inside the fence the saved file sets; and the
    saved one."""
    config, saved = config_mod.parse(body.config), manager.load()
    fence.check(saved, config)
    return config, saved


@router.get("/api/config")
def get_config(manager: Shared, response: Response) -> dict[str, Any]:
    # The tag first: if the file changes in between, a save on this copy is refused (409),
    # never taken over a version the page did not show.
    path = manager.settings.config_path
    response.headers["ETag"] = etag = config_mod.file_tag(path)
    return {"config": manager.load().model_dump(), "path": str(path), "etag": etag}


@router.post("/api/config/preview")
def preview(manager: Shared, body: ConfigBody) -> dict[str, Any]:
    prepared = manager.prepare(*from_api(manager, body))
    return {"plan": plan_of(prepared), "problems": [p.detail() for p in prepared.problems]}


@router.put("/api/config", status_code=202)
def put_config(
    manager: Shared,
    body: ConfigBody,
    if_match: Annotated[str | None, Header(max_length=200)] = None,
) -> dict[str, Any]:
    config, saved = from_api(manager, body)
    plan = plan_of(manager.startable(config, saved))
    path = manager.settings.config_path
    with manager.saving:
        if if_match is not None and if_match != config_mod.file_tag(path):
            raise Refused(
                "config",
                "the config changed since you loaded it (saved from "
                "elsewhere); load it again, then save",
            )
        try:
            config_mod.save(config, path)
        except OSError as exc:
            raise StorageFull(
                "config", f"could not save {path}: {exc.strerror}; the previous config is unchanged"
            ) from None
    manager.sampler.follow(server_url(config))
    try:
        manager.settings.systemd.restart(manager.settings.unit)
    except ServiceError as exc:
        raise ServiceError(f"saved, but the restart failed: {exc}") from None
    finally:
        manager.monitor.changed()
    return {"status": "saved; restarting", "plan": plan}


@router.get("/api/models")
def models(manager: Shared) -> dict[str, Any]:
    config = manager.load()
    found = bounded.call(lambda: list_models(config), "manager.model_roots", "listing models")
    if patterns := config.manager.hub_models:  # those the API may name, fetched already
        found += [
            {"name": f"{repo} (Hugging Face)", "path": repo}
            for repo in bounded.call(hub.cached_ids, "manager.hub_models", "listing the HF cache")
            if allowed(repo, patterns)
        ]
    return {"roots": [str(r) for r in model_roots(config)], "models": found}
