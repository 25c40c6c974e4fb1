"""core.dag: TorchServe's graph rules and one request's run through a graph, on a fake clock."""

from __future__ import annotations

import pytest

from mservd.core.dag import CallNode, Dag, DagError, DropCall, Finish, GraphRun

PAIR = {"pre": ["left", "right"], "left": ["agg"], "right": ["agg"]}


def run(edges=PAIR, deadline=10.0, retries=1, timeout=5.0) -> GraphRun:
    dag = Dag(edges)
    return GraphRun(dag, deadline, {n: retries for n in dag.order},
                    {n: timeout for n in dag.order})


def test_a_graph_with_two_start_nodes_is_refused():
    with pytest.raises(DagError, match="only one start node"):
        Dag({"a": ["c"], "b": ["c"]})


def test_a_cycle_and_a_self_loop_are_refused():
    with pytest.raises(DagError, match="Not a valid DAG"):
        Dag({"a": ["b"], "b": ["c"], "c": ["b"]})
    with pytest.raises(DagError, match="feeds itself"):
        Dag({"a": ["a"]})


def test_order_leaves_and_torchserves_describe_text():
    dag = Dag(PAIR)
    assert dag.order == ["pre", "left", "right", "agg"]
    assert dag.leaves == ["agg"]
    assert dag.describe() == "{pre=[left, right], left=[agg], right=[agg]}"


def test_siblings_start_together_with_their_parents_answer_as_body():
    graph = run()
    assert graph.start(0.0) == [CallNode("pre", 0, None, 5.0)]
    actions = graph.answered("pre", 0, 200, b"h", b"P", "", 0.1)
    assert actions == [CallNode("left", 0, [("body", b"P")], 5.0),
                       CallNode("right", 0, [("body", b"P")], 5.0)]


def test_a_node_with_several_parents_gets_one_input_per_parent_by_name():
    graph = run()
    graph.start(0.0)
    graph.answered("pre", 0, 200, b"h", b"P", "", 0.1)
    assert graph.answered("right", 0, 200, b"h", b"R", "", 0.2) == []
    actions = graph.answered("left", 0, 200, b"h", b"L", "", 0.3)
    assert actions == [CallNode("agg", 0, [("left", b"L"), ("right", b"R")], 5.0)]
    assert graph.answered("agg", 0, 200, b"H", b"A", "", 0.4) == [Finish([("agg", b"H", b"A")])]


def test_joined_leaves_finish_once_all_answered():
    graph = run({"pre": ["a", "b"]})
    graph.start(0.0)
    graph.answered("pre", 0, 200, b"h", b"P", "", 0.1)
    assert graph.answered("b", 0, 200, b"hb", b"B", "", 0.2) == []
    assert graph.answered("a", 0, 200, b"ha", b"A", "", 0.3) == [
        Finish([("a", b"ha", b"A"), ("b", b"hb", b"B")])]


def test_a_5xx_is_retried_after_a_delay_then_fails_naming_the_node():
    graph = run(retries=1)
    graph.start(0.0)
    assert graph.answered("pre", 0, 503, b"", b"", "no worker", 0.0) == []
    assert graph.expire(0.05) == []
    assert graph.expire(0.1) == [CallNode("pre", 1, None, 5.0)]
    assert graph.answered("pre", 1, 500, b"", b"", "boom", 0.2) == [
        Finish(node="pre", status=500, message="boom")]


def test_a_4xx_fails_at_once_and_drops_the_sibling_still_queued():
    graph = run(retries=3)
    graph.start(0.0)
    graph.answered("pre", 0, 200, b"h", b"P", "", 0.1)
    assert graph.answered("left", 0, 400, b"", b"", "bad", 0.2) == [
        DropCall("right", 0), Finish(node="left", status=400, message="bad")]
    assert graph.answered("right", 0, 200, b"h", b"R", "", 0.3) == []  # late: ignored


def test_retries_stop_at_the_graph_deadline():
    graph = run(deadline=0.15, retries=5)
    graph.start(0.0)
    assert graph.answered("pre", 0, 503, b"", b"", "", 0.0) == []  # retry at 0.1
    graph.expire(0.1)
    assert graph.answered("pre", 1, 503, b"", b"", "no worker", 0.1) == [
        Finish(node="pre", status=503, message="no worker")]  # 0.3 is past 0.15


def test_the_graph_deadline_answers_504_naming_open_nodes():
    graph = run(deadline=1.0)
    graph.start(0.0)
    graph.answered("pre", 0, 200, b"h", b"P", "", 0.1)
    assert graph.next_deadline() == 1.0
    actions = graph.expire(1.0)
    assert actions[:2] == [DropCall("left", 0), DropCall("right", 0)]
    assert actions[2].status == 504 and "['left', 'right']" in actions[2].message


def test_a_call_past_its_timeout_is_dropped_and_retried():
    graph = run(timeout=0.5, retries=1)
    graph.start(0.0)
    actions = graph.expire(0.5)
    assert actions == [DropCall("pre", 0)]
    assert graph.expire(0.6) == [CallNode("pre", 1, None, 0.5)]


def test_cancel_drops_open_calls_and_ends_the_run():
    graph = run()
    graph.start(0.0)
    assert graph.cancel() == [DropCall("pre", 0)]
    assert graph.answered("pre", 0, 200, b"", b"", "", 0.1) == []
    assert graph.next_deadline() == float("inf")


def test_several_leaves_join_as_one_json_object_without_parsing_them():
    from mservd import protocol
    from mservd.controller.graphs import _joined

    joined = _joined(b"r", [("a", protocol.head(200), b'{"x": 1}'),
                            ("b", protocol.head(200, "application/json"), b"[2]")])
    assert joined.body == b'{"a": {"x": 1}, "b": [2]}'
    text = _joined(b"r", [("a", protocol.head(200), b"{}"),
                          ("b", protocol.head(200, "text/plain"), b"hi")])
    assert protocol.Head.parse(text.head).status == 500
    assert b"leaf node 'b' answered text/plain" in text.body
    single = _joined(b"r", [("a", protocol.head(200, "text/plain"), b"hi")])
    assert (single.body, protocol.Head.parse(single.head).content_type) == (b"hi", "text/plain")
