"""The rerank codec: a row per document, and the answer from their scores, best first."""

import json

from handlers.text_reranker import Score
from mservd.worker.codecs.base import Call
from mservd.worker.codecs.rerank import CODEC, Rerank


def scored(value: float, tokens: int) -> Score:
    score = Score(value)
    score.prompt_tokens = tokens
    return score


def answer(state: Rerank, outputs: list) -> dict:
    _head, body = CODEC.encode(Call([{}] * len(outputs), state=state), outputs, None, 1 << 20)
    return json.loads(body)


def test_results_are_best_first_ties_in_document_order_with_top_n_and_usage() -> None:
    outputs = [scored(0.2, 5), scored(0.9, 6), scored(0.2, 7), scored(0.5, 8)]
    doc = answer(Rerank("r", ["a", "b", "c", "d"], 3, True), outputs)
    assert [(r["index"], r["document"]["text"]) for r in doc["results"]] == [
        (1, "b"), (3, "d"), (0, "a")]
    assert doc["usage"] == {"total_tokens": 26} and doc["model"] == "r"
    every = answer(Rerank("r", ["a", "b", "c", "d"], 0, False), outputs)
    assert [r["index"] for r in every["results"]] == [1, 3, 0, 2]
    assert all(set(r) == {"index", "relevance_score"} for r in every["results"])


def test_a_handler_that_does_not_score_is_a_400_saying_so() -> None:
    _head, body = CODEC.encode(Call([{}], state=Rerank("echo", ["a"], 0, True)),
                               [{"echo": "a"}], None, 1 << 20)
    assert json.loads(body)["error"]["message"].startswith("Model 'echo' answered dict")
