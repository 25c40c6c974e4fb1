"""What handler code prints: each line tagged with the worker and the requests that wrote it."""

from __future__ import annotations

import logging
import sys

from mservd.process.log_format import formatter


class TaggedStream:
    """stdout/stderr for handler code: each line says which worker and which requests wrote it.

    The model's log then ties a handler's ``print`` to the request ids of the batch it ran in.
    With ``log_format=json`` each line becomes a record like the worker's own log lines (logger
    ``handler``, its request ids a list), so a log shipper reads the whole file one way.
    """

    def __init__(self, stream, pid: int, log_format: str = "plain",
                 level: int = logging.INFO) -> None:
        self._stream = stream
        self._prefix = f"[pid {pid}] "
        self.requests = ""
        self._line_start = True
        self._json = formatter(log_format) if log_format == "json" else None
        self._level = level
        self._partial = ""  # json: the start of a line not yet ended

    def write(self, text: str) -> int:
        if not text:
            return 0
        if self._json is not None:
            lines = (self._partial + text).split("\n")
            self._partial = lines.pop()
            self._stream.write("".join(self._record(line) for line in lines if line))
            return len(text)
        tag = self._prefix + (f"[requests {self.requests}] " if self.requests else "")
        lines = text.split("\n")
        out = []
        for i, line in enumerate(lines):
            if line and (self._line_start or i > 0):
                out.append(tag)
            out.append(line)
            if i < len(lines) - 1:
                out.append("\n")
        self._line_start = text.endswith("\n")
        self._stream.write("".join(out))
        return len(text)

    def _record(self, line: str) -> str:
        record = logging.makeLogRecord({
            "name": "handler", "levelno": self._level,
            "levelname": logging.getLevelName(self._level), "msg": line,
            "requests": self.requests.split(",") if self.requests else []})
        assert self._json is not None  # records are made for log_format=json only
        return self._json.format(record) + "\n"

    def flush(self) -> None:
        if self._partial:  # json: a line flushed before its end is a record of its own
            self._stream.write(self._record(self._partial))
            self._partial = ""
        self._stream.flush()

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def tag_output(requests: str) -> None:
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, TaggedStream):
            stream.requests = requests
