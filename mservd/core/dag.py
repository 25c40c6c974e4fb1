"""A workflow's graph (:class:`Dag`) and one request's way through it (:class:`GraphRun`).

Pure, with no clock of its own: a :class:`GraphRun` is a state machine that takes ``now`` and
the nodes' answers and returns what to do — :class:`CallNode` (queue a call of a node's
model), :class:`DropCall` (cancel one still queued), :class:`Finish` (answer the client) — as
the scheduler returns its actions. The controller's ``graphs.py`` carries them out.

TorchServe's rules (``ensemble/Dag.java``, ``DagExecutor.java``): one start node, no cycle;
the start node gets the client's request; a node with one parent gets that parent's answer as
the input ``body``, a node with several one input per parent, named by the parent; every node
whose parents are done runs at once, so siblings run together. A failed call (5xx, or past its
node's ``timeout-ms``) is retried up to ``retry-attempts`` times while the graph's deadline
allows; then the run ends with that node's error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

RETRY_DELAY = 0.1  # seconds before a failed call's first retry, doubled for each next one
RETRY_DELAY_MOST = 1.0  # ... up to this: a node whose worker died is answered "no worker"
# until its replacement is up (the supervisor restarts it after 1 s or more)


class DagError(ValueError):
    """A graph that is no DAG, in TorchServe's words."""


class Dag:
    """Edges ``node → [children]``, checked: one start node, no cycle; nodes in topological
    order, and each node's parents in that order."""

    def __init__(self, edges: dict[str, Any]) -> None:
        children: dict[str, list[str]] = {}
        for node, targets in edges.items():
            if targets is None:
                targets = []
            if not isinstance(node, str) or not isinstance(targets, list) or not all(
                    isinstance(t, str) for t in targets):
                raise DagError(f"dag entry {node!r} must map a node name to a list of node "
                               "names.")
            if node in targets:
                raise DagError(f"Not a valid DAG: node {node!r} feeds itself.")
            children[node] = list(dict.fromkeys(targets))
            for target in targets:
                children.setdefault(target, [])
        parents: dict[str, list[str]] = {n: [] for n in children}
        for node, targets in children.items():
            for target in targets:
                parents[target].append(node)
        starts = [n for n, p in parents.items() if not p]
        if len(starts) != 1:
            raise DagError(f"DAG should have only one start node, it has {len(starts)}: "
                           f"{starts}.")
        order: list[str] = []
        waiting = {n: len(p) for n, p in parents.items()}
        ready = list(starts)
        while ready:
            node = ready.pop(0)
            order.append(node)
            for child in children[node]:
                waiting[child] -= 1
                if not waiting[child]:
                    ready.append(child)
        if len(order) != len(children):
            raise DagError("Not a valid DAG: it has a cycle through "
                           f"{sorted(n for n in children if n not in order)}.")
        rank = {n: i for i, n in enumerate(order)}
        self.children = children
        self.parents = {n: sorted(p, key=rank.__getitem__) for n, p in parents.items()}
        self.order = order
        self.start = starts[0]
        self.leaves = [n for n in order if not children[n]]

    def describe(self) -> str:
        """The edges as TorchServe's describe shows them (Java's ``Map.toString``)."""
        return "{" + ", ".join(f"{n}=[{', '.join(self.children[n])}]" for n in self.order
                               if self.children[n]) + "}"


@dataclass(frozen=True)
class CallNode:
    """Queue call ``attempt`` of ``node``: ``inputs`` (name, body) from its parents, None for
    the start node (the client's request as it came); at most ``timeout`` seconds."""

    node: str
    attempt: int
    inputs: list[tuple[str, bytes]] | None
    timeout: float


@dataclass(frozen=True)
class DropCall:
    node: str
    attempt: int


@dataclass(frozen=True)
class Finish:
    """The run's end: the leaves' answers (``head``, ``body``) in dag order, or the failure
    of ``node`` (None: the graph's deadline) with ``status`` and ``message``."""

    leaves: list[tuple[str, bytes, bytes]] = field(default_factory=list)
    node: str | None = None
    status: int = 200
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status < 400


GraphAction = CallNode | DropCall | Finish


@dataclass
class _Call:
    attempt: int
    deadline: float  # past it the call counts as failed (timeout-ms)


class GraphRun:
    """One request's run through ``dag``: ``retries`` and ``timeouts`` (seconds) by node."""

    def __init__(self, dag: Dag, deadline: float, retries: dict[str, int],
                 timeouts: dict[str, float]) -> None:
        self.dag = dag
        self.deadline = deadline
        self.retries = retries
        self.timeouts = timeouts
        self.outputs: dict[str, tuple[bytes, bytes]] = {}
        self.open: dict[str, _Call] = {}
        self.later: dict[str, tuple[int, float]] = {}  # retries due: node -> (attempt, when)
        self.finished = False

    def start(self, now: float) -> list[GraphAction]:
        return [self._call(self.dag.start, 0, now)]

    def _call(self, node: str, attempt: int, now: float) -> CallNode:
        timeout = max(0.0, min(self.timeouts[node], self.deadline - now))
        self.open[node] = _Call(attempt, now + timeout)
        parents = self.dag.parents[node]
        inputs = (None if not parents else [("body", self.outputs[parents[0]][1])]
                  if len(parents) == 1 else [(p, self.outputs[p][1]) for p in parents])
        return CallNode(node, attempt, inputs, timeout)

    def answered(self, node: str, attempt: int, status: int, head: bytes, body: bytes,
                 message: str, now: float) -> list[GraphAction]:
        """Call ``attempt`` of ``node`` answered (``message``: its error's, when it failed);
        an answer to a call no longer open is ignored."""
        call = self.open.get(node)
        if self.finished or call is None or call.attempt != attempt:
            return []
        del self.open[node]
        if status >= 400:
            return self._failed(node, attempt, status, message, now)
        self.outputs[node] = (head, body)
        actions: list[GraphAction] = []
        for child in self.dag.children[node]:
            if child not in self.open and all(p in self.outputs for p in self.dag.parents[child]):
                actions.append(self._call(child, 0, now))
        if all(leaf in self.outputs for leaf in self.dag.leaves):
            self.finished = True
            actions.append(Finish([(leaf, *self.outputs[leaf]) for leaf in self.dag.leaves]))
        return actions

    def _failed(self, node: str, attempt: int, status: int, message: str,
                now: float) -> list[GraphAction]:
        due = now + min(RETRY_DELAY * (2 ** attempt), RETRY_DELAY_MOST)
        if status >= 500 and attempt < self.retries[node] and due < self.deadline:
            self.later[node] = (attempt + 1, due)
            return []
        return self._end(Finish(node=node, status=status, message=message))

    def _end(self, finish: Finish) -> list[GraphAction]:
        return [*self._close(), finish]

    def _close(self) -> list[GraphAction]:
        """Finished: its calls still open are dropped, its retries forgotten."""
        self.finished = True
        drops: list[GraphAction] = [DropCall(n, c.attempt) for n, c in self.open.items()]
        self.open.clear()
        self.later.clear()
        return drops

    def expire(self, now: float) -> list[GraphAction]:
        """The graph's deadline, calls past their node's ``timeout-ms``, and retries due."""
        if self.finished:
            return []
        if now >= self.deadline:
            waiting = sorted([*self.open, *self.later])
            return self._end(Finish(status=504, message=(
                f"the workflow's deadline passed with nodes {waiting} still running")))
        actions: list[GraphAction] = []
        for node, call in list(self.open.items()):
            if now >= call.deadline:
                actions.append(DropCall(node, call.attempt))
                actions += self.answered(node, call.attempt, 504, b"", b"",
                                         f"no answer within its timeout-ms "
                                         f"({self.timeouts[node] * 1000:.0f} ms)", now)
                if self.finished:
                    return actions
        for node, (attempt, when) in list(self.later.items()):
            if now >= when:
                del self.later[node]
                actions.append(self._call(node, attempt, now))
        return actions

    def next_deadline(self) -> float:
        if self.finished:
            return float("inf")
        return min([self.deadline, *(c.deadline for c in self.open.values()),
                    *(when for _, when in self.later.values())])

    def cancel(self) -> list[GraphAction]:
        """The client went away: its calls still queued are dropped."""
        return [] if self.finished else self._close()
