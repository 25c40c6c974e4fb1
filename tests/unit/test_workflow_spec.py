"""core.workflow_spec: TorchServe's spec.yaml rules, and errors that name the key to fix."""

from __future__ import annotations

import pytest

from mservd.core.workflow_spec import FunctionNode, ModelNode, SpecError, parse_spec

SPEC = {"models": {"batch-size": 4, "retry-attempts": 2,
                   "m1": {"url": "tiny.mar", "batch-size": 8, "max-workers": 3}},
        "dag": {"pre": ["m1"], "m1": ["post"]}}


def test_globals_are_defaults_and_a_models_keys_override_them():
    spec = parse_spec("wf", SPEC, "h.py", {"pre", "post"})
    m1 = spec.nodes["m1"]
    assert isinstance(m1, ModelNode)
    assert (m1.model, m1.url) == ("wf__m1", "tiny.mar")
    assert (m1.settings.batch_size, m1.settings.max_workers, m1.settings.retry_attempts,
            m1.settings.max_batch_delay, m1.settings.timeout_ms) == (8, 3, 2, 50, 10000)


def test_function_nodes_get_one_worker_and_no_batching():
    spec = parse_spec("wf", SPEC, "h.py", {"pre", "post"})
    pre = spec.nodes["pre"]
    assert isinstance(pre, FunctionNode)
    assert (pre.model, pre.handler) == ("wf__pre", "h.py:pre")
    assert (pre.settings.batch_size, pre.settings.max_workers,
            pre.settings.max_batch_delay) == (1, 1, 0)
    assert list(spec.nodes) == ["pre", "m1", "post"]


def test_a_node_neither_model_nor_function_is_named():
    with pytest.raises(SpecError, match="dag node 'post' is neither a model .* nor a function "
                                        "of h.py"):
        parse_spec("wf", SPEC, "h.py", {"pre"})


def test_a_bad_value_names_its_key():
    bad = {**SPEC, "models": {**SPEC["models"], "m1": {"url": "tiny.mar", "batch-size": 0}}}
    with pytest.raises(SpecError, match=r"models\.m1\.batch-size must be an integer of at least"
                                        r" 1, got 0"):
        parse_spec("wf", bad, "h.py", {"pre", "post"})


def test_a_model_without_url_and_a_missing_dag_are_refused():
    with pytest.raises(SpecError, match=r"models\.m1 must have a url"):
        parse_spec("wf", {"models": {"m1": {}}, "dag": {"m1": []}}, "h.py", set())
    with pytest.raises(SpecError, match="'dag' must map"):
        parse_spec("wf", {"models": {}}, "h.py", set())


def test_a_cycle_is_an_invalid_specification():
    with pytest.raises(SpecError, match="Invalid workflow specification: Not a valid DAG"):
        parse_spec("wf", {"dag": {"a": ["b"], "b": ["a"], "s": ["a"]}}, "h.py", {"a", "b", "s"})
