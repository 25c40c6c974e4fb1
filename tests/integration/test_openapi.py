"""The OpenAPI 3 descriptions: valid, served without a token, complete, and true to the server.

``schemathesis`` fuzzes each served description against a live daemon and fails on any 5xx or
any answer the description does not allow (status, content type or body). The daemon's model
store is empty and downloads are off, so no fuzzed call can start workers (a fuzzed scale to
thousands of workers would take the machine down); every model route still answers its
not-found, bad-request and auth paths. The inference API, which cannot start workers, is also
fuzzed with a live model.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest
import requests

from mservd.frontends.http.routes import MANAGEMENT, inference_api, management_api

MAX_EXAMPLES = 25
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,"
          "response_schema_conformance")

# Every route the inference address serves, as (method, path template); the v2 ones when
# mservd/frontends/http/v2.py is installed.
INFERENCE_ROUTES = {
    ("options", "/"), ("get", "/api-description"), ("get", "/ping"),
    *((m, f"/{kind}/{{model_name}}{v}") for m in ("post", "put", "get")
      for kind in ("predictions", "explanations") for v in ("", "/{model_version}")),
    ("get", "/v1/models"), ("get", "/v1/models/{model_name}"),
    ("post", "/v1/models/{model_name}:predict"), ("post", "/wfpredict/{workflow_name}"),
}
V2_ROUTES = {
    ("get", "/v2"), ("get", "/v2/health/live"), ("get", "/v2/health/ready"),
    *(("get", f"/v2/models/{{model_name}}{v}{rest}")
      for v in ("", "/versions/{model_version}") for rest in ("", "/ready")),
    *(("post", f"/v2/models/{{model_name}}{v}/{rest}")
      for v in ("", "/versions/{model_version}")
      for rest in ("infer", "generate", "generate_stream")),
}
OPENAI_ROUTES = {("post", f"{prefix}/v1/{endpoint}") for prefix in ("", "/openai")
                 for endpoint in ("chat/completions", "completions", "embeddings")} | {
    ("post", path) for path in ("/v1/rerank", "/v2/rerank", "/rerank")}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    from conftest import Daemon

    empty_store = tmp_path_factory.mktemp("openapi-empty-store")
    # no worker lent to a frontend: a fuzzed X-Request-Timeout-Ms of 0 then runs on the idle
    # worker at once, where a lent one's recall may outlast it on a slow minute (a right 504,
    # but a 5xx to not_a_server_error); leases have tests of their own
    daemon = Daemon(tmp_path_factory.mktemp("openapi-daemon"), empty_store,
                    {"lend_idle_workers": "false"}, args=("--enable-model-api",))
    daemon.start()
    yield daemon
    daemon.stop()


def operations(doc: dict[str, Any]) -> set[tuple[str, str]]:
    methods = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}
    return {(m, path) for path, item in doc["paths"].items() for m in item if m in methods}


def validate_openapi_3(doc: dict[str, Any]) -> None:
    """Validate against the official OpenAPI 3.0 JSON schema, then check what it cannot."""
    try:
        from openapi_spec_validator import validate
    except ImportError:  # schemathesis bundles the OpenAPI 3.0 meta-schema
        from schemathesis.specs.openapi.definitions import OPENAPI_30_VALIDATOR

        validate = OPENAPI_30_VALIDATOR.validate
    validate(doc)

    def refs(node: Any):
        if isinstance(node, dict):
            if "$ref" in node:
                yield node["$ref"]
            for value in node.values():
                yield from refs(value)
        elif isinstance(node, list):
            for value in node:
                yield from refs(value)

    for ref in refs(doc):
        target: Any = doc
        for part in ref.removeprefix("#/").split("/"):
            assert part in target, f"unresolved $ref {ref}"
            target = target[part]
    ids = [op["operationId"] for path, item in doc["paths"].items() for op in item.values()]
    assert len(ids) == len(set(ids)), "operationIds must be unique"
    bearer = doc["components"]["securitySchemes"]["bearer"]
    assert (bearer["type"], bearer["scheme"]) == ("http", "bearer")
    for path, item in doc["paths"].items():
        declared = set(re.findall(r"{(\w+)}", path))
        for method, op in item.items():
            params = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert params == declared, f"{method.upper()} {path}: path parameters {params}"
            assert op["responses"], f"{method.upper()} {path} has no responses"
            assert {"414", "431"} <= set(op["responses"]), f"{method.upper()} {path}"
            for code, answer in op["responses"].items():
                if code.startswith("4") and code not in ("414", "431"):
                    schema = answer["content"]["application/json"]["schema"]
                    assert schema.get("$ref", "").endswith(
                        ("/Error", "/V2Error", "/OpenAIError")), (
                        f"{method.upper()} {path} {code}: errors use the error schema")


@pytest.mark.parametrize("make", [inference_api, management_api])
def test_openapi_documents_are_valid_openapi_3(make) -> None:
    doc = make()
    validate_openapi_3(doc)
    assert doc["openapi"].startswith("3.0.")
    error = doc["components"]["schemas"]["Error"]
    assert error["required"] == ["code", "type", "message"]


def test_inference_description_lists_exactly_the_inference_routes() -> None:
    expected = INFERENCE_ROUTES | V2_ROUTES | OPENAI_ROUTES
    assert operations(inference_api()) == expected


def test_management_description_lists_exactly_the_flask_routes() -> None:
    from mservd.frontends.http.management import create_management_app

    app = create_management_app(None, 1.0, True, MANAGEMENT)  # the routes only: no call made
    routes = set()
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        path = re.sub(r"<(\w+)>", r"{\1}", rule.rule)
        automatic = {"HEAD"} | ({"OPTIONS"} if rule.rule != "/" else set())
        routes |= {(m.lower(), path) for m in (rule.methods or set()) - automatic}
    assert operations(management_api()) == routes


@pytest.mark.parametrize("api", ["inference", "management"])
def test_descriptions_are_served_without_a_token(daemon, api) -> None:
    expected = inference_api() if api == "inference" else management_api()
    base = daemon.state["addresses"][api]
    for method, path in (("OPTIONS", "/"), ("GET", "/api-description")):
        answer = requests.request(method, base + path, timeout=10)
        assert answer.status_code == 200, answer.text
        assert answer.headers["Content-Type"].startswith("application/json")
        assert answer.json() == json.loads(json.dumps(expected))
    for method, path in (("GET", "/"), ("POST", "/api-description")):
        refused = requests.request(method, base + path, timeout=10)
        assert refused.status_code == 405
        assert set(refused.json()) == {"code", "type", "message"}


@pytest.mark.parametrize("api", ["inference", "management"])
def test_every_described_route_is_served(daemon, api) -> None:
    """Each described operation answers as a known route (never 'resource not found')."""
    doc = inference_api() if api == "inference" else management_api()
    base = daemon.state["addresses"][api]
    headers = {"Authorization": f"Bearer {daemon.key(api)}"}
    for method, path in sorted(operations(doc)):
        url = base + path.replace("{model_name}", "nomodel").replace("{model_version}", "1.0")
        answer = requests.request(method.upper(), url, headers=headers, timeout=30)
        assert "Requested resource is not found" not in answer.text, (method, path, answer.text)
        assert answer.status_code not in (405, 500), (method, path, answer.text)
        assert str(answer.status_code) in doc["paths"][path][method]["responses"], (
            method, path, answer.status_code)


def schemathesis_run(daemon, api: str, tmp_path, allow_x00: bool) -> subprocess.CompletedProcess:
    url = daemon.state["addresses"][api] + "/api-description"
    argv = [sys.executable, "-m", "schemathesis.cli", "run", url,
            "--header", f"Authorization: Bearer {daemon.key(api)}",
            "--checks", CHECKS, "--max-examples", str(MAX_EXAMPLES), "--seed", "20250101",
            "--phases", "examples,coverage,fuzzing", "--workers", "1",
            "--request-timeout", "30", "--generation-database", "none",
            "--generation-allow-x00", "true" if allow_x00 else "false", "--no-color"]
    return subprocess.run(argv, check=False, capture_output=True, text=True, cwd=tmp_path,
                          timeout=280)


@pytest.mark.timeout(300)
def test_schemathesis_inference_with_a_model_finds_no_server_error(daemon, tmp_path) -> None:
    """Fuzz the inference API with every model route pointed at a live echo model.

    The inference API cannot start workers, so a real model is safe here; it is unregistered
    and its archive removed before the management API is fuzzed.
    """
    from conftest import write_archive

    archive = write_archive(daemon.store, "echo", "echo_handler.py")
    try:
        answer = daemon.manage("POST", "/models", params={"url": archive.name,
                                                          "initial_workers": 1})
        assert answer.status_code == 200, answer.text
        (tmp_path / "schemathesis.toml").write_text(
            '[parameters]\n"path.model_name" = "echo"\n"path.model_version" = "1.0"\n')
        result = schemathesis_run(daemon, "inference", tmp_path, allow_x00=True)
    finally:
        daemon.manage("DELETE", "/models/echo")
        archive.unlink()
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    assert re.search(r"\d+ generated, \d+ passed", output), output[-4000:]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("api", ["inference", "management"])
def test_schemathesis_finds_no_server_error_and_no_undescribed_answer(daemon, api,
                                                                      tmp_path) -> None:
    assert daemon.manage("GET", "/models").json() == {"models": []}  # nothing to scale
    result = schemathesis_run(daemon, api, tmp_path, allow_x00=True)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    assert re.search(r"\d+ generated, \d+ passed", output), output[-4000:]


def test_register_url_with_a_nul_byte_is_a_client_error(daemon) -> None:
    answer = daemon.manage("POST", "/models", params={"url": "a\x00b.mar"})
    assert answer.status_code == 400, answer.text
    assert "NUL byte" in answer.json()["message"]
