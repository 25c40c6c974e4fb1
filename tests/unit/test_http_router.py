"""The HTTP routes' dispatch (frontends/http/router.py) and the inference port's table
(frontends/http/routes.py): which handler a request's method and path reach, with which path
parameters, and what a path no route takes is answered — as the if-chains that served these
routes before the table answered them."""

from __future__ import annotations

import pytest

from mservd.errors import MethodNotAllowed, MservdError, ResourceNotFound
from mservd.frontends.http import inference, kserve_v1, routes, v2
from mservd.frontends.http.request import HttpRequest
from mservd.frontends.http.router import WALKS_KEPT, Route, Router


def request(method: str, path: str) -> HttpRequest:
    scope = {"method": method, "path": path, "query_string": b"", "headers": []}

    async def receive() -> dict:
        raise AssertionError("dispatch reads no body")

    return HttpRequest(scope, receive)


def handler(*args: object) -> None:
    raise AssertionError("dispatch calls no handler")


def other(*args: object) -> None:
    raise AssertionError("dispatch calls no handler")


def not_found(request: HttpRequest) -> MservdError:
    return ResourceNotFound(f"nothing at {request.path}")


def refused(router: Router, method: str, path: str) -> MservdError:
    with pytest.raises(MservdError) as error:
        router.find(request(method, path))
    return error.value


def test_router_fills_each_parameter_from_its_segment() -> None:
    router = Router([Route("GET", "/a/{x}/b/{y}", handler, None),
                     Route("GET", "/a/{x}", other, None)], not_found)
    route, params = router.find(request("GET", "/a/1/b/2"))
    assert route.handler is handler and params == {"x": "1", "y": "2"}
    route, params = router.find(request("GET", "/a/1"))
    assert route.handler is other and params == {"x": "1"}
    assert refused(router, "GET", "/a/1/c/2").message == "nothing at /a/1/c/2"
    assert refused(router, "GET", "/a//b/2").http_status == 404  # no empty parameter


def test_router_takes_an_empty_segment_only_for_a_blank_parameter_and_the_rest_whole() -> None:
    router = Router([Route("POST", "/p/{m}/{v}", handler, None, rest="tail", blank=("v",))],
                    not_found)
    assert router.find(request("POST", "/p/m/"))[1] == {"m": "m", "v": ""}
    assert router.find(request("POST", "/p/m//x/y"))[1] == {"m": "m", "v": "", "tail": "x/y"}
    assert router.find(request("POST", "/p/m/1/"))[1] == {"m": "m", "v": "1", "tail": ""}
    assert refused(router, "POST", "/p//1").http_status == 404


def test_router_splits_a_segment_at_its_colon_only_where_a_verb_is_declared() -> None:
    router = Router([Route("GET", "/m/{name}", handler, None),
                     Route("POST", "/m/{name}:go", other, None),
                     Route("GET", "/n/{name}", handler, None)], not_found)
    assert router.find(request("POST", "/m/a:go")) == (router.routes[1], {"name": "a"})
    assert router.find(request("GET", "/m/a:"))[1] == {"name": "a"}  # no verb: the plain one
    assert refused(router, "GET", "/m/a:stop").http_status == 404
    assert router.find(request("GET", "/n/a:b"))[1] == {"name": "a:b"}


def test_router_ignores_trailing_slashes_only_under_the_segments_that_ask() -> None:
    router = Router([Route("GET", "/s/x", handler, None, strip_slash=True),
                     Route("GET", "/t/x", handler, None)], not_found)
    assert router.find(request("GET", "/s/x//"))[0].handler is handler
    assert refused(router, "GET", "/t/x/").http_status == 404
    with pytest.raises(ValueError, match="must agree on strip_slash"):
        Router([Route("GET", "/s/x", handler, None, strip_slash=True),
                Route("GET", "/s/y", handler, None)], not_found)


def test_router_answers_405_with_the_first_method_declared_for_the_path() -> None:
    router = Router([Route("POST", "/p", handler, None), Route("PUT", "/p", handler, None)],
                    not_found)
    error = refused(router, "DELETE", "/p")
    assert isinstance(error, MethodNotAllowed)
    assert error.message == "Method DELETE is not allowed on /p; use POST."


def test_router_answers_a_miss_by_the_first_prefix_that_matches_else_its_default() -> None:
    def under_p(request: HttpRequest) -> MservdError:
        return ResourceNotFound("under p")

    router = Router([Route("GET", "/p/x", handler, None)], not_found, [(("/p/",), under_p)])
    assert refused(router, "GET", "/p/y").message == "under p"
    assert refused(router, "GET", "/q").message == "nothing at /q"
    assert refused(router, "GET", "*").message == "nothing at *"  # no leading slash


def test_router_refuses_a_route_declared_twice_or_a_template_it_cannot_match() -> None:
    with pytest.raises(ValueError, match="declared twice"):
        Router([Route("GET", "/p", handler, None), Route("GET", "/p", other, None)], not_found)
    for template in ("/p/{x}abc", "/p/{x}:", "/p/{{x}"):
        with pytest.raises(ValueError, match="is neither {name} nor {name}:verb"):
            Router([Route("GET", template, handler, None)], not_found)
    with pytest.raises(ValueError, match="differs from {x}"):
        Router([Route("GET", "/p/{x}", handler, None), Route("GET", "/p/{y}/z", other, None)],
               not_found)


def test_router_remembers_at_most_walks_kept_paths() -> None:
    router = Router([Route("GET", "/p/{m}", handler, None)], not_found)
    for n in range(WALKS_KEPT + 5):
        router.find(request("GET", f"/p/{n}"))
    assert len(router.walked) <= WALKS_KEPT
    assert router.find(request("GET", "/p/7"))[1] == {"m": "7"}  # forgotten, walked again


# -- the inference port, as its if-chains answered it -----------------------------------


@pytest.mark.parametrize(("method", "path", "handler", "params"), [
    ("POST", "/predictions/m", inference.predict, {"model_name": "m"}),
    ("GET", "/predictions/m/", inference.predict, {"model_name": "m", "model_version": ""}),
    ("PUT", "/predictions/m/1.0/v1/chat", inference.predict,
     {"model_name": "m", "model_version": "1.0", "url_path": "v1/chat"}),
    ("POST", "/predictions/m//x", inference.predict,
     {"model_name": "m", "model_version": "", "url_path": "x"}),
    ("POST", "/explanations/m/2", inference.explain, {"model_name": "m", "model_version": "2"}),
    ("GET", "/v1/models/", kserve_v1.list_models, {}),
    ("GET", "/openai/v1/models/m", kserve_v1.model_ready, {"model_name": "m"}),
    ("GET", "/v1/models/m:", kserve_v1.model_ready, {"model_name": "m"}),
    ("POST", "/v1/models/m:predict/", kserve_v1.predict, {"model_name": "m"}),
    ("GET", "/v2/", v2.server_metadata, {}),
    ("GET", "/v2/models/m/versions/ready", v2.model_metadata,
     {"model_name": "m", "model_version": "ready"}),
    ("POST", "/v2/models/m/versions/1/infer", v2.infer, {"model_name": "m", "model_version": "1"}),
    ("POST", "/v2/models/a:b/generate_stream", v2.generate_stream, {"model_name": "a:b"}),
])
def test_inference_routes_reach_their_handlers(method, path, handler, params) -> None:
    route, found = routes.INFERENCE.find(request(method, path))
    assert route.handler is handler and found == params


@pytest.mark.parametrize(("method", "path", "status", "message"), [
    ("DELETE", "/predictions/", 405, "Method DELETE is not allowed on /predictions/; use POST."),
    ("POST", "/predictions/", 404,
     "Requested resource is not found: /predictions/. Use /predictions/{model_name}[/{version}]."),
    ("GET", "/ping/", 404,
     "Requested resource is not found: GET /ping/. Try POST /predictions/{model_name}."),
    ("GET", "/", 405, "Method GET is not allowed on /; use OPTIONS."),
    ("POST", "/v2/models//ready", 404, ("Requested resource is not found: POST "
     "/v2/models//ready. The v2 routes are /v2, /v2/health/{live,ready} and "
     "/v2/models/{model}[/versions/{version}][/ready|/infer|/generate|/generate_stream].")),
    ("GET", "/v2/models/m/versions/", 404, ("Requested resource is not found: "
     "/v2/models/m/versions. Use /v2/models/{model}/versions/{version}.")),
    ("GET", "/v2/models/m/x/y", 404, "Requested resource is not found: /v2/models/m/x/y."),
    ("GET", "/v1/models/m:predict", 405,
     "Method GET is not allowed on /v1/models/m:predict; use POST."),
    ("GET", "/openai/v1/models/a/b/", 404, ("Requested resource is not found: GET "
     "/v1/models/a/b. The KServe V1 routes are /v1/models and /v1/models/{model}[:predict].")),
    ("POST", "/openai/", 404, ("Requested resource is not found: POST /openai. The OpenAI "
     "routes are /v1/chat/completions, /v1/completions, /v1/embeddings and /v1/models.")),
    ("GET", "/v1/chat/completions", 405,
     "Method GET is not allowed on /v1/chat/completions; use POST."),
])
def test_inference_routes_refuse_as_before(method, path, status, message) -> None:
    error = refused(routes.INFERENCE, method, path)
    assert (error.http_status, error.message) == (status, message)


@pytest.mark.parametrize(("method", "path", "status", "message"), [
    ("POST", "/dashboard/actions/bogus", 404,
     "No dashboard action 'bogus': use scale, set-default, traffic."),
    ("GET", "/dashboard/actions/scale", 405,
     "Method GET is not allowed on /dashboard/actions/scale; use POST."),
    ("POST", "/dashboard/static/a/b", 405,
     "Method POST is not allowed on /dashboard/static/a/b; use GET."),
    ("GET", "/dashboard/static/", 404,
     "Requested resource is not found: /dashboard/static/. The dashboard is GET /dashboard."),
])
def test_dashboard_routes_refuse_as_before(method, path, status, message) -> None:
    error = refused(routes.DASHBOARD, method, path)
    assert (error.http_status, error.message) == (status, message)


def test_metrics_route_refuses_as_before() -> None:
    assert refused(routes.METRICS, "POST", "/metrics").message == "Use GET /metrics."
    assert refused(routes.METRICS, "GET", "/metrics/").message == (
        "Requested resource is not found: /metrics/. Try /metrics.")


def test_every_described_route_is_dispatched_to_its_own_handler() -> None:
    """The document and the dispatch come from one table: each described operation's path,
    its parameters filled in, reaches that operation's route."""
    for route in routes.INFERENCE.routes:
        if route.operation is None:
            continue
        path = route.path.replace("{model_name}", "m").replace("{model_version}", "1")
        assert routes.INFERENCE.find(request(route.method, path))[0] is route
