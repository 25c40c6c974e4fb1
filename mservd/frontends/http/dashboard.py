"""The live dashboard on the management port: ``GET /dashboard`` and what its page reads.

    GET  /dashboard                  the page (mservd/frontends/http/dashboard_page/), or a key form answered 401
    POST /dashboard/login            the management key from that form: a session in a cookie
    POST /dashboard/logout           the session ended, the cookie dropped
    GET  /dashboard/overview         the overview document (mservd/controller/overview.py), for scripts too
    GET  /dashboard/events           the same document once a second, as server-sent events
    POST /dashboard/actions/scale    {"model", "version", "min_worker"}: the scale verb
    POST /dashboard/actions/set-default  {"model", "version"}: the set-default verb
    POST /dashboard/actions/traffic  {"model", "traffic"}: the set-traffic verb (core/traffic.py)
    GET  /dashboard/static/<file>    the page's script and style (no data in them)

Every call but the form, the login and the static files carries the management key as a
bearer token (scripts), or the cookie the login set (the page: HttpOnly, SameSite=Strict, so a
script on another site can neither read nor send it). The cookie holds a session, never the
key: a random id the controller's key store maps to the management key (``auth.py``), ended
by the logout, by a rotation of the management key, after ``auth.SESSION_HOURS`` or when the
key expires, whichever comes first. The controller checks the key or session on each
document, so an ended session ends a stream. An action made with the cookie must also carry
``X-Mservd-Dashboard: 1``, which a form on another site cannot send. The actions are the
management API's own verbs, with their checks and errors. ``routes.DASHBOARD`` declares the
routes; a trailing slash is ignored.
"""

from __future__ import annotations

import asyncio
import json
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from mservd import protocol
from mservd.auth import LOGOUT, SESSION, SESSION_HOURS, SESSION_PREFIX
from mservd.errors import BadRequest, MservdError, NoWorker, ResourceNotFound, Unauthorized
from mservd.frontends.async_bridge import AsyncBridge
from mservd.frontends.bridge import ControllerGone, bearer_token
from mservd.frontends.http.request import (
    JSON,
    Answer,
    HttpRequest,
    challenged,
    model_and_version,
    not_allowed,
)
from mservd.frontends.http.router import Params
from mservd.protocol import Reply

COOKIE = "mservd_dashboard"
SESSION_SECONDS = int(SESSION_HOURS * 3600)  # the cookie's Max-Age
EVERY = 1.0  # seconds between two documents of a stream
TIMEOUT = 30.0  # seconds the controller has to answer one call
MAX_BODY = 4096  # bytes of a login form or an action
STATIC = {"dashboard.js": "text/javascript; charset=utf-8",
          "dashboard.css": "text/css; charset=utf-8"}
ACTIONS = ("scale", "set-default", "traffic")  # under /dashboard/actions/
STATIC_PREFIX, ACTIONS_PREFIX = "/dashboard/static/", "/dashboard/actions/"

_LOGIN = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>mservd dashboard
</title><link rel="icon" href="data:,"><link rel="stylesheet" href="/dashboard/static/dashboard.css"></head><body><header>
<h1>mservd</h1></header><main><form method="post" action="/dashboard/login" class="model">
<h3>The management key</h3><p class="muted">It is in key_file.json, under "management". This
browser keeps a session for it (not the key), for 8 hours at most.</p><p>{problem}</p><input name="key" type="password"
autocomplete="off" autofocus size="40"> <button>Open the dashboard</button></form></main>
</body></html>"""


class DashboardRoutes:
    def __init__(self, bridge: AsyncBridge, auth: bool, body_timeout: float) -> None:
        self.bridge = bridge
        self.auth = auth
        self.body_timeout = body_timeout

    async def dashboard(self, request: HttpRequest, params: Params) -> Answer:
        """The page, or the key form (401) to a caller without a key or session."""
        token, _ = self.credentials(request)
        if self.auth and await self.refusal(token, request.client) is not None:
            return login_form(401, "" if token is None else "That key was refused.")
        return Answer(200, page("dashboard.html"), "text/html; charset=utf-8",
                      [("Cache-Control", "no-store")])

    async def overview_document(self, request: HttpRequest, params: Params) -> Answer:
        token, _ = self.credentials(request)
        reply = await self.overview(token, request.client)
        return Answer(reply.status, reply.body, reply.content_type,
                      challenged(reply.status, [("Cache-Control", "no-store")]))

    def credentials(self, request: HttpRequest) -> tuple[str | None, bool]:
        """The key a call carries, and whether it came in the cookie."""
        if not self.auth:
            return None, False
        header = request.headers.get("authorization")
        if header is not None:
            return bearer_token(header), False
        for part in request.headers.get("cookie", "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == COOKIE and value.startswith(SESSION_PREFIX):  # a session, never a key
                return value, True
        return None, False

    async def refusal(self, token: str | None, client: str | None = None):
        """The controller's refusal of a management key or session, or None
        (``AsyncBridge.refusal``: a stranger's key is asked about spaced, a known one not at
        all)."""
        return await self.bridge.refusal(token, protocol.API_MANAGEMENT, client=client)

    async def overview(self, token: str | None, client: str | None = None):
        return await self.keyed("overview", {}, token, client)

    async def keyed(self, verb: str, args: dict[str, Any], token: str | None,
                    client: str | None = None):
        """A verb that needs the management key, a stranger's refused before it is sent."""
        refused = await self.refusal(token, client) if self.auth else None
        if refused is not None:
            return refused
        reply = await self.bridge.manage(verb, args, token, TIMEOUT)
        if self.auth:
            self.bridge.answered(token, protocol.API_MANAGEMENT, reply.status)
        return reply

    async def login(self, request: HttpRequest, params: Params) -> Answer:
        if not self.auth:
            return Answer(303, b"", JSON, [("Location", "/dashboard")])
        form = parse_qs((await request.body(MAX_BODY, self.body_timeout)).decode("utf-8",
                                                                                  "replace"))
        key = (form.get("key") or [""])[0].strip()
        session = await self.session_for(key, request.client) if key else None
        if session is None:
            return login_form(401, "That key was refused: give the management key.")
        session_id, seconds = session
        cookie = (f"{COOKIE}={session_id}; Path=/dashboard; Max-Age={seconds}; HttpOnly; "
                  "SameSite=Strict")
        return Answer(303, b"", JSON, [("Location", "/dashboard"), ("Set-Cookie", cookie),
                                       ("Cache-Control", "no-store")])

    async def session_for(self, key: str, client: str) -> tuple[str, int] | None:
        """A new session for the management ``key`` and its seconds to live, or None if the
        controller refused the key (it checks the key itself: anyone may ask, spaced)."""
        reply = await self.bridge.ask_open("token", {"type": SESSION}, key, TIMEOUT,
                                           client=client)
        if reply.status != 200:
            return None
        session = json.loads(reply.body).get("key")
        if not isinstance(session, str) or not session.startswith(SESSION_PREFIX):
            return None
        return session, SESSION_SECONDS  # the controller ends it sooner if the key expires

    async def logout(self, request: HttpRequest, params: Params) -> Answer:
        """End the session the cookie holds (the controller forgets it: every page and
        stream opened with it is refused from its next document) and drop the cookie."""
        token, by_cookie = self.credentials(request)
        if by_cookie and request.headers.get("x-mservd-dashboard") != "1":
            raise Unauthorized("A dashboard logout made with its cookie must carry the header "
                               "X-Mservd-Dashboard: 1.")
        if self.auth and token is not None and token.startswith(SESSION_PREFIX):
            reply = await self.bridge.ask_open("token", {"type": LOGOUT}, token, TIMEOUT,
                                               client=request.client)
            self.bridge.forget(token, protocol.API_MANAGEMENT)
            if reply.status != 200:
                return Answer(reply.status, reply.body, reply.content_type,
                              challenged(reply.status, []))
        cookie = f"{COOKIE}=; Path=/dashboard; Max-Age=0; HttpOnly; SameSite=Strict"
        return Answer(200, json.dumps({"status": "Logged out"}).encode(), JSON,
                      [("Set-Cookie", cookie), ("Cache-Control", "no-store")])

    async def events(self, request: HttpRequest, params: Params) -> Answer:
        token, _ = self.credentials(request)
        first = await self.overview(token, request.client)
        if first.status != 200:
            return Answer(first.status, first.body, first.content_type,
                          challenged(first.status, []))
        gone = asyncio.Event()
        request.on_hang_up(gone.set)

        async def stream():
            reply = first
            while True:
                if reply.status != 200:  # the key expired or the daemon is stopping
                    yield b"event: error\ndata: " + reply.body + b"\n\n"
                    return
                yield b"data: " + reply.body + b"\n\n"
                try:
                    await asyncio.wait_for(gone.wait(), EVERY)
                    return  # the page was closed: no more documents are asked for
                except TimeoutError:
                    pass
                try:
                    reply = await self.overview(token)
                except ControllerGone as exc:  # the daemon died: said, not a bare cut
                    reply = Reply.error(NoWorker(str(exc)))

        return Answer(200, b"", "text/event-stream",
                      [("Cache-Control", "no-store"), ("X-Accel-Buffering", "no")], stream=stream())

    async def scale(self, request: HttpRequest, params: Params) -> Answer:
        return await self.action(request, "scale")

    async def set_default(self, request: HttpRequest, params: Params) -> Answer:
        return await self.action(request, "set_default")

    async def traffic(self, request: HttpRequest, params: Params) -> Answer:
        return await self.action(request, "set_traffic")

    async def action(self, request: HttpRequest, verb: str) -> Answer:
        """The management verb ``verb`` on the model the body names."""
        token, by_cookie = self.credentials(request)
        if by_cookie and request.headers.get("x-mservd-dashboard") != "1":
            raise Unauthorized("A dashboard action made with its cookie must carry the header "
                               "X-Mservd-Dashboard: 1.")
        refused = await self.refusal(token, request.client) if self.auth else None
        if refused is not None:  # before its body is read
            return Answer(refused.status, refused.body, refused.content_type,
                          challenged(refused.status, []))
        try:
            doc = json.loads(await request.body(MAX_BODY, self.body_timeout))
        except ValueError:
            raise BadRequest("The body must be a JSON object.") from None
        if not isinstance(doc, dict):
            raise BadRequest("The body must be a JSON object.")
        args = model_and_version(doc.get("model"), doc.get("version"))
        if verb == "set_traffic":  # as JSON text, as the management API sends it
            args["traffic"] = json.dumps(doc.get("traffic"))
        if verb == "scale":
            args["min_worker"] = doc.get("min_worker")
            args["synchronous"] = "false"
        reply = await self.keyed(verb, args, token)
        return Answer(reply.status, reply.body, reply.content_type,
                      challenged(reply.status, list((reply.headers or {}).items())))

    async def static(self, request: HttpRequest, params: Params) -> Answer:
        name = params["file"]
        if name not in STATIC:
            raise ResourceNotFound(f"Requested resource is not found: {request.path}.")
        return Answer(200, page(name), STATIC[name], [("Cache-Control", "no-cache")])


def not_found(request: HttpRequest) -> MservdError:
    """A path under ``/dashboard`` that no route takes."""
    path = request.path.rstrip("/")
    if path.startswith(STATIC_PREFIX):  # a file in a folder: no such file
        if request.method != "GET":
            return not_allowed(request, "GET")
        return ResourceNotFound(f"Requested resource is not found: {request.path}.")
    if path.startswith(ACTIONS_PREFIX):
        return ResourceNotFound(f"No dashboard action {path.removeprefix(ACTIONS_PREFIX)!r}: "
                                f"use {', '.join(ACTIONS)}.")
    return ResourceNotFound(f"Requested resource is not found: {request.path}. The dashboard "
                            "is GET /dashboard.")


def page(name: str) -> bytes:
    return resources.files("mservd.frontends.http").joinpath("dashboard_page", name).read_bytes()


def login_form(status: int, problem: str) -> Answer:
    import html

    body = _LOGIN.format(problem=html.escape(problem)).encode()
    return Answer(status, body, "text/html; charset=utf-8",
                  challenged(status, [("Cache-Control", "no-store")]))
