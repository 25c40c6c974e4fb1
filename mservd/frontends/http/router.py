"""How a port's declared routes (``routes.py``) are found for a request: a tree of path
segments, built once, walked a segment at a time.

A :class:`Route` is one operation: its method, its path template (OpenAPI's:
``/v2/models/{model_name}/ready``), the handler that answers it and its :class:`Operation`, what
``openapi.py`` writes of it. :class:`Router` indexes the routes by their first path segment and
walks the rest of a path through literal and parameter children: a dictionary look-up a segment,
no pattern tried against the path; and it remembers where the paths it walked lately led, so the
paths a client names again and again (a prediction's is its model's: the hot path) cost one
look-up. This module does no IO and knows no route; it only matches.

- A parameter fills one segment, which may be empty only where its route names it in
  ``blank`` (TorchServe's ``/predictions/m//x``: no version).
- ``{name}:verb`` (KServe's ``{model_name}:predict``) splits a segment at its first colon
  wherever such a template is declared; what follows the colon picks the route (nothing: the
  plain ``{name}``).
- A route's ``rest`` parameter takes the segments past its template, slashes kept (TorchServe's
  ``url_path``); it is never described.
- A route with ``strip_slash`` ignores trailing slashes (KServe, v2 and OpenAI clients send
  them); the routes under one first segment agree on it.

A path no template takes is answered by the first of the router's ``misses`` whose prefix it
starts with, else by its ``default``: each says which routes are near. A path that matches in
another method is 405, naming the first method declared for it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mservd.errors import MservdError
from mservd.frontends.http.request import Answer, HttpRequest, not_allowed

#: the error that answers a request whose path no route takes
Miss = Callable[[HttpRequest], MservdError]
#: a route's path parameters, as its handler gets them
Params = Mapping[str, str]

# Paths whose walk a router remembers, forgotten all at once when full: a client's requests
# name a few paths over and over, and a look-up of the whole path costs a quarter of a walk
# (0.13 against 0.52 us for /predictions/{model}); a stranger's made-up paths only cost them
# the memory.
WALKS_KEPT = 1024


@dataclass(frozen=True)
class Operation:
    """What a route's OpenAPI operation says (``openapi.document`` writes it)."""

    id: str
    summary: str
    #: every answer it can give: status (or ``default``) → an OpenAPI response object; the
    #: HTTP server's own 414 and 431 are added to each
    answers: Mapping[str, Any]
    parameters: Sequence[Mapping[str, Any]] = ()
    body: Mapping[str, Any] | None = None  # its requestBody
    description: str | None = None
    token: bool = True  # False: answered without a bearer token (``security: []``)


@dataclass(frozen=True)
class Route:
    """One operation of a port: ``handler(context, request, params)`` answers it, where the
    context is the port's (the gateway, the dashboard) and ``params`` its path parameters.
    ``operation`` None: served but left out of the OpenAPI document (why: where it is
    declared)."""

    method: str
    path: str
    handler: Callable[..., Any]
    operation: Operation | None
    strip_slash: bool = False
    rest: str | None = None
    blank: tuple[str, ...] = ()


class _Node:
    """The routes of the paths that have come this far, and where each next segment leads."""

    __slots__ = ("colon", "literals", "param", "params", "rest", "routes")

    def __init__(self) -> None:
        self.literals: dict[str, _Node] = {}
        # by verb ("" for a plain {name}): the parameter's name, whether it may be empty, and
        # where it leads
        self.params: dict[str, tuple[str, bool, _Node]] = {}
        self.param: tuple[str, bool, _Node] | None = None  # params[""], looked up once
        self.colon = False  # a {name}:verb is declared here: a segment splits at its colon
        self.routes: dict[str, Route] = {}  # by method, for a path that ends here
        self.rest: str | None = None


class Router:
    def __init__(self, routes: Sequence[Route], default: Miss,
                 misses: Sequence[tuple[tuple[str, ...], Miss]] = (),
                 wrong_method: Callable[[HttpRequest, str], MservdError] = not_allowed) -> None:
        self.routes = tuple(routes)
        self.default = default
        self.misses = tuple(misses)
        self.wrong_method = wrong_method  # the 405 of a request, given the method to use
        self.walked: dict[str, tuple[_Node, Params]] = {}  # by path: see WALKS_KEPT
        self.branches: dict[str, tuple[bool, _Node]] = {}  # by first segment: strip_slash, tree
        for route in self.routes:
            self._add(route)

    def _add(self, route: Route) -> None:
        first, *segments = route.path[1:].split("/")
        strip, node = self.branches.setdefault(first, (route.strip_slash, _Node()))
        if strip != route.strip_slash:
            raise ValueError(f"{route.method} {route.path}: the routes under /{first} must "
                             "agree on strip_slash.")
        for segment in segments:
            if not segment.startswith("{"):
                node = node.literals.setdefault(segment, _Node())
                continue
            name, _, suffix = segment[1:].partition("}")
            verb = suffix.removeprefix(":")
            if suffix[:1] not in ("", ":") or suffix == ":" or "{" in name:
                raise ValueError(f"{route.path}: {segment!r} is neither {{name}} nor "
                                 "{name}:verb.")
            blank = name in route.blank
            entry = node.params.setdefault(verb, (name, blank, _Node()))
            if entry[:2] != (name, blank):
                raise ValueError(f"{route.method} {route.path}: {segment!r} differs from "
                                 f"{{{entry[0]}}} declared there before.")
            node.colon = node.colon or bool(verb)
            node.param = node.params.get("")
            node = entry[2]
        if route.method in node.routes:
            raise ValueError(f"{route.method} {route.path} is declared twice.")
        if node.routes and node.rest != route.rest:
            raise ValueError(f"{route.method} {route.path}: rest differs from that of the "
                             "other methods on this path.")
        node.routes[route.method] = route
        node.rest = route.rest

    def owns(self, path: str) -> bool:
        """Whether ``path`` is under one of this router's first segments."""
        return path[:1] == "/" and path[1:].partition("/")[0] in self.branches

    def find(self, request: HttpRequest) -> tuple[Route, Params]:
        """The route that answers ``request``, and its path parameters (shared by the
        requests for the same path: read them, never change them).

        :raises MservdError: the miss's error (mostly 404) when no route takes the path; 405
            when one does in another method.
        """
        path = request.path
        walked = self.walked.get(path)
        if walked is None:
            walked = self._walk(request)
            if len(self.walked) >= WALKS_KEPT:
                self.walked.clear()
            self.walked[path] = walked
        node, params = walked
        route = node.routes.get(request.method)
        if route is None:
            if not node.routes:
                raise self.miss(request)
            raise self.wrong_method(request, next(iter(node.routes)))
        return route, params

    def _walk(self, request: HttpRequest) -> tuple[_Node, Params]:
        """Where ``request``'s path leads in the tree, and the parameters it filled."""
        path = request.path
        segments = path.split("/")  # ["", first, ...] for a path that starts with "/"
        branch = None if segments[0] or len(segments) < 2 else self.branches.get(segments[1])
        if branch is None:
            raise self.miss(request)
        strip, node = branch
        if strip and path[-1] == "/":
            segments = path.rstrip("/").split("/")
        params: dict[str, str] = {}
        for at in range(2, len(segments)):
            segment = segments[at]
            child = node.literals.get(segment)
            if child is None:
                if node.colon:
                    value, _, verb = segment.partition(":")
                    entry = node.params.get(verb)
                else:
                    value, entry = segment, node.param
                if entry is not None and (segment or entry[1]):
                    params[entry[0]] = value
                    child = entry[2]
                elif node.rest is not None:
                    params[node.rest] = "/".join(segments[at:])
                    break
                else:
                    raise self.miss(request)
            node = child
        return node, params

    def miss(self, request: HttpRequest) -> MservdError:
        for prefixes, miss in self.misses:
            if request.path.startswith(prefixes):
                return miss(request)
        return self.default(request)

    def serving(self, context: Any) -> Callable[[HttpRequest, dict[str, Any]],
                                               Awaitable[Answer]]:
        """The port's answer to each request: its route's handler, given ``context``."""
        find = self.find

        def answer(request: HttpRequest, scope: dict[str, Any]) -> Awaitable[Answer]:
            route, params = find(request)  # raises here, in the caller's try
            return route.handler(context, request, params)  # no coroutine of its own

        return answer
