"""A snapshot turns back into the register calls that made the registry, auto batching too."""

from __future__ import annotations

from pathlib import Path

import pytest

from mservd.config import Settings, resolve_model_settings
from mservd.config.convert import Problems
from mservd.config.model_keys import traffic_of_models_block, valid_models_block
from mservd.controller import snapshot
from mservd.core.registry import ModelVersion, Registry
from mservd.core.traffic import TrafficPolicy


def version(name: str, yaml: dict) -> ModelVersion:
    settings = resolve_model_settings(Settings(), name, "1.0", model_yaml=yaml)
    return ModelVersion(name=name, version="1.0", url=f"{name}.mar", model_dir=Path("/nowhere"),
                        manifest={"model": {"handler": "h.py"}}, settings=settings,
                        model_yaml=yaml)


def test_a_snapshot_restores_set_and_auto_batch_sizes_and_says_continuous_batching() -> None:
    registry = Registry()
    registry.add(version("fixed", {"batchSize": 4}))
    registry.add(version("auto", {"batchSize": "auto", "maxLatencyMs": 80}))
    registry.add(version("llm", {"batchSize": 16, "continuousBatching": True}))
    document = snapshot.capture(registry)
    assert document["models"]["llm"]["versions"]["1.0"]["continuousBatching"] is True
    registrations, defaults = snapshot._parse(document)
    sizes = {r["model_name"]: r["batch_size"] for r in registrations}
    assert sizes == {"fixed": 4, "auto": "auto", "llm": 16}
    restored = resolve_model_settings(Settings(), "auto", "1.0",
                                      api={"batch_size": sizes["auto"]})
    assert restored.auto_batch and restored.batch_size == 8
    assert defaults == {"fixed": "1.0", "auto": "1.0", "llm": "1.0"}


def test_a_snapshot_names_a_handler_only_when_the_register_call_did() -> None:
    registry = Registry()
    registry.add(version("own", {}))  # the archive's handler: a rebuilt archive may change it
    named = version("named", {})
    named.handler_override = "other.py:handle"
    registry.add(named)
    registrations, _ = snapshot._parse(snapshot.capture(registry))
    handlers = {r["model_name"]: r["handler"] for r in registrations}
    assert handlers == {"own": None, "named": "other.py:handle"}


def test_a_snapshot_keeps_a_models_traffic_policy_and_load_latest_gives_it_back(tmp_path) -> None:
    registry = Registry()
    registry.add(version("plain", {}))
    registry.add(version("split", {}))
    policy = TrafficPolicy({"1.0": 9}, sticky=True, max_error_rate={"1.0": 0.25})
    registry.set_traffic("split", policy)
    document = snapshot.capture(registry)
    assert "traffic" not in document["models"]["plain"]
    assert document["models"]["split"]["traffic"] == policy.document()
    snapshot.write(tmp_path, document)
    restored = snapshot.load_latest(tmp_path)
    assert restored.traffic == {"split": policy.document()}
    assert TrafficPolicy.parse("split", restored.traffic["split"], ["1.0"]) == policy


def test_the_models_block_traffic_keys_make_a_policy_document() -> None:
    models = {"m": {"1.0": {"trafficWeight": 90}, "2.0": {"trafficWeight": "10",
                                                         "maxErrorRate": 0.2},
                    "3.0": {"shadowPercent": 25, "stickyTraffic": True}},
              "plain": {"1.0": {"defaultVersion": True}}}
    assert valid_models_block(models) is models
    assert traffic_of_models_block(models) == {"m": {
        "weights": {"1.0": 90.0, "2.0": 10.0}, "sticky": True, "shadow": {"3.0": 25.0},
        "maxErrorRate": {"2.0": 0.2}}}
    with pytest.raises(Problems, match="trafficWeight"):
        valid_models_block({"m": {"1.0": {"trafficWeight": "lots"}}})
def test_a_snapshot_restores_workflows_with_their_node_scales_and_not_their_nodes_alone(
        ) -> None:
    from mservd.controller.workflows import WorkflowEntry
    from mservd.core.workflow_spec import parse_spec

    registry = Registry()
    registry.add(version("plain", {}))
    node = version("wf__m1", {})
    node.workflow, node.target_workers, node.max_workers = "wf", 2, 3
    registry.add(node)
    spec = parse_spec("wf", {"models": {"m1": {"url": "tiny.mar"}}, "dag": {"m1": []}},
                      "h.py", set())
    entry = WorkflowEntry("wf", "wf.war", spec, Path("/nowhere"), 30.0)
    document = snapshot.capture(registry, {"wf": entry})
    assert list(document["models"]) == ["plain"]
    (restore,) = snapshot._parse_workflows(document)
    assert restore.args == {"url": "wf.war", "workflow_name": "wf", "response_timeout": 30.0}
    assert restore.scales == {"wf__m1": (2, 3)}
    registrations, _ = snapshot._parse(document)
    assert [r["model_name"] for r in registrations] == ["plain"]
