"""What a handler prints, as the model's log gets it: tagged with the worker and the batch's
request ids, and in ``log_format=json`` one record per line."""

from __future__ import annotations

import io
import json
import logging

from mservd.worker.stdout import TaggedStream


def test_plain_lines_carry_the_worker_and_its_requests() -> None:
    out = io.StringIO()
    stream = TaggedStream(out, 42)
    stream.requests = "a,b"
    stream.write("one\ntw")
    stream.write("o\n")
    stream.requests = ""
    stream.write("three\n")
    assert out.getvalue() == "[pid 42] [requests a,b] one\n[pid 42] [requests a,b] two\n" \
                             "[pid 42] three\n"


def test_json_lines_are_records_and_a_line_is_written_once_it_ends() -> None:
    out = io.StringIO()
    stream = TaggedStream(out, 42, "json", logging.WARNING)
    stream.requests = "a,b"
    stream.write("one\ntw")
    assert len(out.getvalue().splitlines()) == 1  # "tw" waits for the rest of its line
    stream.write("o\n\n")
    stream.requests = ""
    stream.write("unended")
    stream.flush()
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["message"] for r in records] == ["one", "two", "unended"]  # blank lines dropped
    assert [r["requests"] for r in records] == [["a", "b"], ["a", "b"], []]
    assert {(r["logger"], r["level"]) for r in records} == {("handler", "WARNING")}
