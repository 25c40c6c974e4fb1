"""A workflow's spec (TorchServe's ``spec.yaml``) read into nodes: which are models, which are
functions, under which model names they are registered, and each one's settings.

Pure: the dict ``yaml.safe_load`` made in, a :class:`WorkflowSpec` or a :class:`SpecError`
out. TorchServe's rules (``ensemble/WorkFlow.java``): the keys under ``models:`` that are one
of the six settings are defaults for every model; any other key is a model ``{url, <settings>}``
registered as ``<workflow>__<key>``; a ``dag:`` node that is no model is a function of the
handler file, registered as ``<workflow>__<fn>`` with one worker and no batching.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from mservd.core.dag import Dag, DagError

# TorchServe's defaults of the settings under models:, by their spec names
DEFAULTS = {"min-workers": 1, "max-workers": 1, "batch-size": 1, "max-batch-delay": 50,
            "retry-attempts": 1, "timeout-ms": 10000}
_FIELDS = {"min-workers": "min_workers", "max-workers": "max_workers",
           "batch-size": "batch_size", "max-batch-delay": "max_batch_delay",
           "retry-attempts": "retry_attempts", "timeout-ms": "timeout_ms"}
_LOWEST = {"min-workers": 0, "max-workers": 1, "batch-size": 1, "max-batch-delay": 0,
           "retry-attempts": 0, "timeout-ms": 1}
SEPARATOR = "__"  # <workflow>__<node>: a node's model name, as in TorchServe


class SpecError(ValueError):
    """A spec that cannot run; the message names the key and how to fix it."""


@dataclass(frozen=True)
class NodeSettings:
    min_workers: int = 1
    max_workers: int = 1
    batch_size: int = 1
    max_batch_delay: int = 50
    retry_attempts: int = 1  # calls retried after a 5xx or a timeout (0: none)
    timeout_ms: int = 10000  # one call's time, queue and worker together


@dataclass(frozen=True)
class ModelNode:
    """A node served by a model archive of the model store (``url``)."""

    name: str
    model: str  # its model's name: <workflow>__<name>
    url: str
    settings: NodeSettings


@dataclass(frozen=True)
class FunctionNode:
    """A node served by a function of the workflow's handler file, in a worker of its own."""

    name: str
    model: str
    handler: str  # <handler file>:<function>, as handlers/loader.py loads it
    settings: NodeSettings


Node = ModelNode | FunctionNode


@dataclass(frozen=True)
class WorkflowSpec:
    name: str
    dag: Dag
    nodes: dict[str, Node]  # in the dag's topological order
    defaults: NodeSettings

    @property
    def models(self) -> list[ModelNode]:
        return [n for n in self.nodes.values() if isinstance(n, ModelNode)]

    @property
    def functions(self) -> list[FunctionNode]:
        return [n for n in self.nodes.values() if isinstance(n, FunctionNode)]


def node_model(workflow: str, node: str) -> str:
    return f"{workflow}{SEPARATOR}{node}"


def _settings(base: NodeSettings, where: str, doc: dict[str, Any]) -> NodeSettings:
    changes = {}
    for key, value in doc.items():
        if key not in _FIELDS:
            continue
        if type(value) is not int or value < _LOWEST[key]:
            raise SpecError(f"Invalid workflow specification: {where}{key} must be an integer "
                            f"of at least {_LOWEST[key]}, got {value!r}.")
        changes[_FIELDS[key]] = value
    settings = replace(base, **changes)
    if settings.max_workers < settings.min_workers:
        raise SpecError(f"Invalid workflow specification: {where}max-workers "
                        f"({settings.max_workers}) is less than min-workers "
                        f"({settings.min_workers}).")
    return settings


def parse_spec(workflow: str, doc: Any, handler_file: str,
               functions: set[str]) -> WorkflowSpec:
    """The spec of workflow ``workflow``; ``functions`` are the top-level ``def``s of
    ``handler_file``, so a node that is neither a model nor a function is refused now rather
    than when its worker fails to load."""
    if not isinstance(doc, dict):
        raise SpecError("Invalid workflow specification: the spec must be a mapping with "
                        "'models' and 'dag'.")
    models = doc.get("models") or {}
    edges = doc.get("dag")
    if not isinstance(models, dict):
        raise SpecError("Invalid workflow specification: 'models' must be a mapping.")
    if not isinstance(edges, dict) or not edges:
        raise SpecError("Invalid workflow specification: 'dag' must map each node to the list "
                        "of nodes it feeds, e.g. dag: {pre: [m1], m1: [post]}.")
    defaults = _settings(NodeSettings(), "models.", {k: v for k, v in models.items()
                                                      if k in DEFAULTS})
    try:
        dag = Dag(edges)
    except DagError as exc:
        raise SpecError(f"Invalid workflow specification: {exc}") from None
    nodes: dict[str, Node] = {}
    for name in dag.order:
        if SEPARATOR in name or not name.replace("_", "a").replace("-", "a").isalnum():
            raise SpecError(f"Invalid workflow specification: node {name!r} must be letters, "
                            "digits, '-' and single '_' only.")
        model = node_model(workflow, name)
        entry = models.get(name)
        if name in models and name not in DEFAULTS:
            if not isinstance(entry, dict) or not isinstance(entry.get("url"), str):
                raise SpecError(f"Invalid workflow specification: models.{name} must have a "
                                "url, the .mar's name in the model store.")
            nodes[name] = ModelNode(name, model, entry["url"],
                                    _settings(defaults, f"models.{name}.", entry))
        elif name in functions:
            # TorchServe's function node: one worker, no batching
            nodes[name] = FunctionNode(name, model, f"{handler_file}:{name}", replace(
                defaults, min_workers=1, max_workers=1, batch_size=1, max_batch_delay=0))
        else:
            raise SpecError(f"Invalid workflow specification: dag node {name!r} is neither a "
                            f"model under 'models' nor a function of {handler_file}.")
    unused = [k for k in models if k not in DEFAULTS and k not in nodes]
    if unused:
        raise SpecError(f"Invalid workflow specification: models {unused} are in no dag edge.")
    return WorkflowSpec(workflow, dag, nodes, defaults)
