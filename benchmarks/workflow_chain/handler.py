"""The function nodes of the workflow benchmark's chain (benchmarks/workflows.py)."""

import json


def _json(value):
    return json.loads(value) if isinstance(value, (bytes, bytearray)) else value


def pre(data, context):
    """64 numbers in, the same numbers halved (the tiny MLP's input) out."""
    if data is None:
        return None
    return [json.dumps([float(x) * 0.5 for x in _json(row.get("body"))]) for row in data]


def post(data, context):
    """The tiny MLP's 10 scores in, the best class and its score out."""
    if data is None:
        return None
    out = []
    for row in data:
        scores = _json(row.get("body"))
        best = max(range(len(scores)), key=scores.__getitem__)
        out.append(json.dumps({"class": best, "score": scores[best]}))
    return out
