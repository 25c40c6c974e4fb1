"""Running workflow graphs: a ``/wfpredict`` request from its arrival to its answer.

Each run is a :class:`~mservd.core.dag.GraphRun`; this module carries out what it decides. A
node call is a request of the controller's own (frontend ``OWN``) to the node's model, queued
through the scheduler like any prediction, so it batches with other traffic and its model's
limits apply; its answer comes back through ``Controller.questions``. A node's answer goes on
to the next nodes as the same bytes object the worker's DONE carried: the controller decodes
only the client's small meta header, once per run, never a payload. A leaf's answer goes to
the client as it is (several leaves: joined into one JSON object without parsing them).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from mservd import protocol
from mservd.core.dag import CallNode, DropCall, Finish, GraphAction, GraphRun
from mservd.errors import BadRequest, error_body, error_message

if TYPE_CHECKING:
    from mservd.controller.workflows import WorkflowEntry, Workflows
    from mservd.core.metrics import Metrics
    from mservd.core.registry import Registry
    from mservd.core.scheduler import Action, Scheduler

log = logging.getLogger(__name__)

OWN = b"controller"  # the controller's own requests (loop.OWN)
ERROR_TYPES = {400: "BadRequestException", 404: "ModelNotFoundException",
               503: "ServiceUnavailableException", 504: "RequestTimeoutException"}


class GraphHost(Protocol):
    """What running graphs may use of the controller."""

    registry: Registry
    scheduler: Scheduler
    metrics: Metrics
    workflows: Workflows
    questions: dict[bytes, Callable[[protocol.Result], None]]

    def perform(self, actions: Sequence[Action]) -> None: ...

    def answer(self, fid: bytes, result: protocol.Result) -> None: ...


class Run:
    """One client's request through one workflow."""

    __slots__ = ("arrived", "entry", "fid", "frames", "graph", "headers", "rid")

    def __init__(self, fid: bytes, rid: bytes, entry: WorkflowEntry, frames: list[bytes],
                 headers: dict[str, str], graph: GraphRun, arrived: float) -> None:
        self.fid = fid
        self.rid = rid
        self.entry = entry
        self.frames = frames  # the client's meta header and body, as they came
        self.headers = headers  # the client's headers, copied onto every node's call
        self.graph = graph
        self.arrived = arrived


class Graphs:
    def __init__(self, ctl: GraphHost) -> None:
        self.ctl = ctl
        self.runs: dict[tuple[bytes, bytes], Run] = {}

    def start(self, fid: bytes, route: protocol.Route, parts: list[bytes], now: float) -> None:
        """A ``/wfpredict`` request: its run starts with the start node's call. Raises what
        the request is refused with (an unknown workflow, a malformed request)."""
        entry = self.ctl.workflows.get(route.model)
        meta = protocol.unpackb(parts[0]) if parts else None
        if not (isinstance(meta, list) and len(meta) == 3 and isinstance(meta[2], dict)):
            raise BadRequest("A workflow request must carry its meta header.")
        sent = route.sent
        arrived = sent if sent is not None and 0.0 <= now - sent < 60.0 else now
        limit = min(self.ctl.scheduler.request_timeout(route), entry.response_timeout)
        spec = entry.spec
        graph = GraphRun(spec.dag, arrived + limit,
                         {n: node.settings.retry_attempts for n, node in spec.nodes.items()},
                         {n: node.settings.timeout_ms / 1000.0 for n, node in spec.nodes.items()})
        run = Run(fid, route.rid, entry, parts, meta[2], graph, arrived)
        self.runs[(fid, route.rid)] = run
        self.carry_out(run, graph.start(now), now)

    def carry_out(self, run: Run, actions: list[GraphAction], now: float) -> None:
        for action in actions:
            if type(action) is CallNode:
                self._call(run, action, now)
            elif type(action) is DropCall:
                rid = _call_rid(run, action.node, action.attempt)
                if self.ctl.questions.pop(rid, None) is not None:
                    self.ctl.perform(self.ctl.scheduler.cancel(OWN, rid, now)[1])
            elif type(action) is Finish:
                self._finish(run, action, now)

    def _call(self, run: Run, call: CallNode, now: float) -> None:
        node = run.entry.spec.nodes[call.node]
        rid = _call_rid(run, call.node, call.attempt)
        if call.inputs is None:
            frames = run.frames
        else:  # no content type: the handler gets bytes, as in TorchServe
            frames = [protocol.packb([protocol.CODEC_TORCHSERVE,
                                      [[name, ""] for name, _ in call.inputs], run.headers]),
                      *(body for _, body in call.inputs)]
        route = protocol.Route(rid, node.model, None, None, timeout_ms=call.timeout * 1000.0,
                               sent=now, inputs=len(frames) - 1)
        self.ctl.questions[rid] = lambda result: self._answered(run, call, result)
        mv, refused = self.ctl.scheduler.enqueue(OWN, route, frames, now)
        self.ctl.perform(refused if mv is None else self.ctl.scheduler.dispatch(mv, now))

    def _answered(self, run: Run, call: CallNode, result: protocol.Result) -> None:
        now = time.monotonic()
        status = protocol.Head.parse(result.head).status
        message = ""
        if status >= 400:  # the error's JSON is read on the error path only
            message = error_message(result.body)
            self.ctl.metrics.workflow_node_failures.labels(run.entry.name, call.node).inc()
            log.warning("workflow %s node %s (try %d) answered %d: %s", run.entry.name,
                        call.node, call.attempt + 1, status, message)
        self.carry_out(run, run.graph.answered(call.node, call.attempt, status, result.head,
                                               result.body, message, now), now)

    def _finish(self, run: Run, finish: Finish, now: float) -> None:
        self.runs.pop((run.fid, run.rid), None)
        name = run.entry.name
        if finish.ok:
            result = _joined(run.rid, finish.leaves)
        else:
            status = finish.status
            if finish.node is None:
                message = f"Workflow '{name}' did not finish in time: {finish.message}"
            else:
                model = run.entry.spec.nodes[finish.node].model
                version = self.ctl.registry.default_version(model)
                message = (f"Workflow '{name}' node '{finish.node}' (model {model} version "
                           f"{version}) failed: {finish.message}")
            result = protocol.Result(run.rid, protocol.head(status), error_body(
                status, ERROR_TYPES.get(status, "InternalServerException"), message))
        status = protocol.Head.parse(result.head).status
        self.ctl.metrics.workflow_requests.labels(name, f"{status // 100}XX").inc()
        self.ctl.metrics.workflow_latency.labels(name).observe(now - run.arrived)
        self.ctl.answer(run.fid, result)

    def tick(self, now: float) -> None:
        """Runs past their deadline, node calls past theirs, and retries that are due."""
        for run in [r for r in self.runs.values() if r.graph.next_deadline() <= now]:
            self.carry_out(run, run.graph.expire(now), now)

    def next_deadline(self) -> float:
        return min((r.graph.next_deadline() for r in self.runs.values()), default=float("inf"))

    def cancel(self, fid: bytes, rid: bytes, now: float) -> bool:
        """The client went away: its run's queued calls are dropped. False: no run of its."""
        run = self.runs.pop((fid, rid), None)
        if run is None:
            return False
        self.carry_out(run, run.graph.cancel(), now)
        return True


def _call_rid(run: Run, node: str, attempt: int) -> bytes:
    return b"%s/%s/%d" % (run.rid, node.encode(), attempt)


def _joined(rid: bytes, leaves: list[tuple[str, bytes, bytes]]) -> protocol.Result:
    """The answer of a run's leaves: one leaf's as it is; several as ``{"leaf": <its JSON>}``,
    joined as bytes (a leaf whose answer is not JSON is a 500 that names it)."""
    if len(leaves) == 1:
        _, head, body = leaves[0]
        return protocol.Result(rid, head, body)
    pieces = []
    for node, head, body in leaves:
        kind = protocol.Head.parse(head).content_type.split(";", 1)[0].strip().lower()
        if kind != protocol.JSON and not kind.endswith("+json"):
            return protocol.Result(rid, protocol.head(500), error_body(
                500, "InternalServerException", f"Workflow leaf node '{node}' answered "
                f"{kind or 'no content type'}, not JSON: several leaves are joined into one "
                "JSON object."))
        pieces.append(json.dumps(node).encode() + b": " + bytes(body))
    return protocol.Result(rid, protocol.head(200), b"{" + b", ".join(pieces) + b"}")
