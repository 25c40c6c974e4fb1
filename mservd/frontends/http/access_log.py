"""The HTTP frontends' access log: one line per request, in gunicorn's format (which
TorchServe users' log tooling already reads), or one JSON object with ``log_format=json``.

Lines are buffered and written together by :meth:`AccessLog.flush`, which the server calls a
few times a second: a write call per request was a measurable share of a refusal's cost."""

from __future__ import annotations

import json
import time
from typing import IO


class AccessLog:
    def __init__(self, path: str | None, log_format: str = "plain") -> None:
        self.file: IO[str] | None = open(path, "a") if path else None  # noqa: SIM115
        self.lines: list[str] = []
        self.json = log_format == "json"
        self._second = -1
        self._stamp = ""

    def _now(self) -> str:
        second = int(time.time())
        if second != self._second:  # formatting the time once a second, not per request
            self._second = second
            self._stamp = time.strftime("[%d/%b/%Y:%H:%M:%S +0000]", time.gmtime(second))
        return self._stamp

    def write(self, client: str, method: str, url: str, version: str, status: int,
              started: float, rid: str) -> None:
        if self.file is None:
            return
        micros = int((time.perf_counter() - started) * 1e6)
        if self.json:
            path = url.split("?", 1)[0]
            line = json.dumps({"time": self._now(), "client": client, "method": method,
                               "path": path, "status": status, "latency_us": micros,
                               "request_id": rid})
        else:
            line = f'{self._now()} {client} "{method} {url} HTTP/{version}" {status} {micros}us {rid}'
        self.lines.append(line)

    def flush(self) -> None:
        if self.file is not None and self.lines:
            self.lines.append("")
            self.file.write("\n".join(self.lines))
            self.file.flush()
            self.lines.clear()

    def close(self) -> None:
        if self.file is not None:
            self.flush()
            self.file.close()
            self.file = None
