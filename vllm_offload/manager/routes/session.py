"""Logging in and out, the page and its two static files, and the manager's own health."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Form, Request, Response
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse

from vllm_offload.errors import Forbidden
from vllm_offload.manager import page
from vllm_offload.manager.auth import SESSION_COOKIE, origin_matches
from vllm_offload.manager.state import Manager, manager_of

router = APIRouter()
Shared = Annotated[Manager, Depends(manager_of)]


@router.get("/healthz")
async def healthz(manager: Shared) -> JSONResponse:
    if await manager.monitor.stopped():
        return JSONResponse({"status": "the unit monitor stopped"}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/static/{name}")
def static(
    name: Literal["dashboard.js", "charts.js", "models.js", "switches.js", "style.css"],
) -> FileResponse:
    media = "text/javascript" if name.endswith(".js") else "text/css"
    return FileResponse(page.STATIC / name, media_type=media)


@router.get("/login", response_class=HTMLResponse)
def login_page(manager: Shared) -> str:
    return page.login(manager.settings.token_file)


@router.post("/login")
def login(
    manager: Shared, request: Request, token: Annotated[str, Form(max_length=512)]
) -> Response:
    if not origin_matches(request):
        raise Forbidden("Origin", "the Origin header is missing or names another site")
    if not manager.sessions.check_guess(request, "form", token.strip()):
        return HTMLResponse(page.login(manager.settings.token_file, failed=True), status_code=401)
    session_id, _csrf = manager.sessions.create()
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        session_id,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
def logout(manager: Shared, request: Request) -> Response:
    manager.sessions.drop(request.cookies.get(SESSION_COOKIE))
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE)
    return response


@router.get("/", response_class=HTMLResponse)
def dashboard(manager: Shared, request: Request) -> Response:
    csrf = manager.sessions.csrf_for(request.cookies.get(SESSION_COOKIE))
    if csrf is None:
        return RedirectResponse("/login", status_code=303)
    return HTMLResponse(page.dashboard(csrf, manager.settings.unit))
