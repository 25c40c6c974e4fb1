"""The container and KServe manifests agree with each other and with mservd.

deploy/kserve/*.yaml, the Dockerfile and deploy/kserve/config/config.properties name the same
ports, arguments and paths; the core Kubernetes objects (and every container spec, including
the ones inside KServe's custom resources) validate against the Kubernetes schemas of
kubernetes-validate. KServe's own fields are checked here, since its CRDs are not in those
schemas. No Docker engine or cluster is needed.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from mservd.cli.commands import port_env_address, start_command
from mservd.config import load, parse_address

REPO = Path(__file__).resolve().parents[2]
KSERVE = REPO / "deploy" / "kserve"
EXAMPLE_CONFIG = KSERVE / "config" / "config.properties"
MOUNT = "/mnt/models"  # where KServe's storage initializer puts the storage


# --- reading the files ----------------------------------------------------------------------


def manifests() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(KSERVE.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                docs.append((path.name, doc))
    return docs


def of_kind(kind: str) -> list[tuple[str, dict[str, Any]]]:
    return [(name, doc) for name, doc in manifests() if doc["kind"] == kind]


def runtime() -> dict[str, Any]:
    (found,) = [doc for _, doc in of_kind("ClusterServingRuntime")
                if doc["metadata"]["name"] == "mservd"]
    return found


def runtime_container() -> dict[str, Any]:
    (container,) = runtime()["spec"]["containers"]
    return container


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined."""
    text = (REPO / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def instruction(name: str) -> list[str]:
    return [rest for word, rest in dockerfile() if word == name]


def exec_form(name: str) -> list[str]:
    (value,) = instruction(name)
    parsed = json.loads(value)  # exec form only: no shell in between to eat SIGTERM
    assert isinstance(parsed, list) and all(isinstance(v, str) for v in parsed)
    return parsed


def arg_value(args: list[str], option: str) -> str:
    values = [a.split("=", 1)[1] for a in args if a.startswith(option + "=")]
    assert len(values) == 1, f"{option}=VALUE once in {args}"
    return values[0]


def example_settings():
    return load(EXAMPLE_CONFIG, env={})


def port_of(address: str) -> int:
    return parse_address(address)[2]


# --- Kubernetes schemas ---------------------------------------------------------------------


def k8s_validate(doc: dict[str, Any]) -> None:
    kv = pytest.importorskip("kubernetes_validate")
    kv.validate(doc, kv.latest_version(), strict=True)


def as_pod(container: dict[str, Any], name: str = "kserve-container") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "check"},
            "spec": {"containers": [{"name": name, **container}]}}


CORE_API_VERSIONS = {"v1", "apps/v1", "batch/v1", "networking.k8s.io/v1", "policy/v1"}
KSERVE_MODEL_FIELDS = {"modelFormat", "runtime", "storageUri", "protocolVersion"}


def test_manifests_parse_and_core_objects_validate() -> None:
    docs = manifests()
    kinds = {doc["kind"] for _, doc in docs}
    assert {"ClusterServingRuntime", "InferenceService", "PersistentVolumeClaim",
            "Pod"} <= kinds
    core = [(name, doc) for name, doc in docs if doc["apiVersion"] in CORE_API_VERSIONS]
    assert core
    for name, doc in core:
        k8s_validate(doc)


def test_container_specs_inside_kserve_objects_validate() -> None:
    """ServingRuntime containers and InferenceService model specs are core/v1 Containers."""
    k8s_validate(as_pod(runtime_container()))
    for name, isvc in of_kind("InferenceService"):
        model = {k: v for k, v in isvc["spec"]["predictor"]["model"].items()
                 if k not in KSERVE_MODEL_FIELDS}
        k8s_validate(as_pod(model))


def test_schema_check_is_real() -> None:
    kv = pytest.importorskip("kubernetes_validate")
    bad = as_pod({**runtime_container(), "ports": [{"containerPort": "eight"}]})
    with pytest.raises(kv.ValidationError):
        k8s_validate(bad)


# --- the runtime, the Dockerfile and config.properties agree ---------------------------------


def test_runtime_declares_format_protocols_annotations_and_resources() -> None:
    spec = runtime()["spec"]
    assert {"name": "pytorch", "version": "1"}.items() <= spec["supportedModelFormats"][0].items()
    assert set(spec["protocolVersions"]) == {"v1", "v2", "grpc-v2"}
    settings = example_settings()
    assert spec["annotations"]["prometheus.kserve.io/path"] == "/metrics"
    assert int(spec["annotations"]["prometheus.kserve.io/port"]) == port_of(
        settings.metrics_address)
    container = runtime_container()
    assert container["name"] == "kserve-container"
    assert container["resources"]["requests"] and container["resources"]["limits"]
    # Knative routes one port, set per InferenceService; none here to collide with it
    assert "ports" not in container


def test_runtime_args_are_mservd_start_options_and_match_the_layout() -> None:
    args = runtime_container()["args"]
    known = {opt for param in start_command.params for opt in param.opts}
    for arg in args:
        assert arg.split("=", 1)[0] in known, f"{arg} is not a `mservd start` option"
    assert arg_value(args, "--model-store") == f"{MOUNT}/model-store"
    assert arg_value(args, "--ts-config") == f"{MOUNT}/config/config.properties"
    # the example config sits in the same place relative to the storage root
    assert EXAMPLE_CONFIG.relative_to(KSERVE) == Path("config/config.properties")
    assert "--disable-token-auth" in args  # KServe authenticates callers
    assert "--enable-model-api" not in args  # models come from the storage mount only
    settings = example_settings()
    assert settings.model_store == arg_value(args, "--model-store")
    assert int(arg_value(args, "--grpc-port")) == settings.grpc_inference_port


def test_dockerfile_entry_matches_the_runtime() -> None:
    assert exec_form("ENTRYPOINT") == ["mservd", "start", "--foreground"]
    assert exec_form("CMD") == runtime_container()["args"]
    assert instruction("STOPSIGNAL") == ["SIGTERM"]
    (base,) = instruction("FROM")
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", base), base


def test_dockerfile_runs_as_the_runtime_user() -> None:
    (user,) = instruction("USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and uid != "0"  # numeric, so runAsNonRoot can verify it
    security = runtime_container()["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["runAsUser"] == int(uid)
    assert security["allowPrivilegeEscalation"] is False
    # the working directory holds logs/, which the readiness probe reads
    assert instruction("WORKDIR")[-1] == "/home/mservd"


def test_dockerfile_exposes_exactly_the_ports_in_use() -> None:
    exposed = {int(p.split("/")[0]) for value in instruction("EXPOSE") for p in value.split()}
    settings = example_settings()
    in_use = {port_of(settings.inference_address), settings.grpc_inference_port,
              port_of(settings.metrics_address)}
    assert exposed == in_use
    # what is not exposed is not listening beyond the pod
    assert parse_address(settings.management_address)[1] == "127.0.0.1"
    assert port_of(settings.management_address) not in exposed


def test_dockerfile_copies_existing_files_not_dockerignored() -> None:
    ignored = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    copies = instruction("COPY")
    assert copies
    for value in copies:
        sources = shlex.split(value)[:-1]
        for source in sources:
            assert (REPO / source).exists(), f"COPY {source}: no such file"
            assert source not in ignored, f"COPY {source} but .dockerignore drops it"
    for needed in ("pyproject.toml", "README.md", "mservd", "handlers", "archiver"):
        assert any(needed in shlex.split(v)[:-1] for v in copies), needed
    for heavy in (".venv", ".git", "logs", "model_store/*.mar"):
        assert heavy in ignored


def test_example_config_binds_for_a_container_and_leaves_auth_to_kserve() -> None:
    settings = example_settings()
    assert parse_address(settings.inference_address)[1] == "0.0.0.0"
    assert parse_address(settings.metrics_address)[1] == "0.0.0.0"
    assert settings.disable_token_authorization is True
    assert settings.enable_model_api is False
    assert settings.load_models == ("all",)
    assert settings.log_dir == "logs"  # relative: under the WORKDIR, where the probe looks
    assert not settings.extra, f"keys mservd ignores: {sorted(settings.extra)}"


def test_readiness_probe_reads_the_state_file_and_asks_v2_ready() -> None:
    probe = runtime_container()["readinessProbe"]
    command = probe["exec"]["command"]
    assert command[:2] == ["python", "-c"]
    settings = example_settings()
    assert f"{settings.log_dir}/mservd.state.json" in command[2]
    assert "/v2/health/ready" in command[2]
    compile(command[2], "probe", "exec")


# --- the InferenceServices --------------------------------------------------------------------


def model_entry(name: str) -> dict[str, Any]:
    (entry,) = example_settings().models[name].values()
    return entry


def test_inference_services_use_the_runtime_and_scale_on_workers_times_batch() -> None:
    spec = runtime()["spec"]
    formats = {f["name"] for f in spec["supportedModelFormats"]}
    isvcs = of_kind("InferenceService")
    assert len(isvcs) >= 3
    for name, isvc in isvcs:
        assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
        annotations = isvc["metadata"].get("annotations", {})
        assert annotations.get("serving.kserve.io/enable-prometheus-scraping") == "true", name
        predictor = isvc["spec"]["predictor"]
        model = predictor["model"]
        assert model["runtime"] == runtime()["metadata"]["name"], name
        assert model["modelFormat"]["name"] in formats, name
        assert model["protocolVersion"] in spec["protocolVersions"], name
        assert model["storageUri"].startswith("pvc://mservd-models/"), name
        entry = model_entry("tiny")
        assert entry["minWorkers"] == entry["maxWorkers"]
        assert predictor["scaleMetric"] == "concurrency", name
        assert predictor["scaleTarget"] == entry["minWorkers"] * entry["batchSize"], name
        assert predictor["containerConcurrency"] >= predictor["scaleTarget"], name
        assert 1 <= predictor["minReplicas"] <= predictor["maxReplicas"], name
        # the drain after SIGTERM fits in the grace period Knative derives from the timeout
        assert example_settings().drain_timeout < predictor["timeout"], name


def test_grpc_service_routes_the_grpc_port() -> None:
    (isvc,) = [doc for _, doc in of_kind("InferenceService")
               if doc["spec"]["predictor"]["model"]["protocolVersion"] == "grpc-v2"]
    (port,) = isvc["spec"]["predictor"]["model"]["ports"]
    assert port["name"] == "h2c"
    assert port["containerPort"] == int(arg_value(runtime_container()["args"], "--grpc-port"))


def test_canary_updates_the_same_service() -> None:
    by_name: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for file, isvc in of_kind("InferenceService"):
        by_name.setdefault(isvc["metadata"]["name"], []).append((file, isvc))
    (canary_file, canary), = [(f, d) for f, d in of_kind("InferenceService")
                              if "canaryTrafficPercent" in d["spec"]["predictor"]]
    assert 0 < canary["spec"]["predictor"]["canaryTrafficPercent"] < 100
    stable = [d for f, d in by_name[canary["metadata"]["name"]] if f != canary_file]
    assert stable, "the canary must update an InferenceService shipped beside it"
    assert (stable[0]["spec"]["predictor"]["model"]["storageUri"]
            != canary["spec"]["predictor"]["model"]["storageUri"])


# --- PORT: how the container learns its HTTP port from Knative ---------------------------------


def test_port_env_replaces_the_inference_port_keeping_the_host() -> None:
    settings = example_settings()
    assert port_env_address(settings, {"PORT": "9000"}) == "http://0.0.0.0:9000"
    assert port_env_address(settings, {}) is None
    assert port_env_address(settings, {"PORT": " "}) is None


def test_port_env_equal_to_the_grpc_port_is_left_to_grpc() -> None:
    settings = example_settings()
    assert port_env_address(settings, {"PORT": str(settings.grpc_inference_port)}) is None


def test_port_env_keeps_ipv6_brackets_and_rejects_garbage() -> None:
    settings = load(None, env={}, overrides={"inference_address": "http://[::1]:8080"})
    assert port_env_address(settings, {"PORT": "8085"}) == "http://[::1]:8085"
    for bad in ("http", "-1", "70000"):
        with pytest.raises(click.ClickException, match="PORT"):
            port_env_address(settings, {"PORT": bad})
