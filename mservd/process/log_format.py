"""How every mservd process formats its log records: ``log_format`` plain or json.

One place, so the daemon's, the frontends' and the workers' logs read alike and a log shipper
parses them all the same way.
"""

from __future__ import annotations

import json
import logging
import sys

PLAIN = "%(asctime)s [pid %(process)d] %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {"time": self.formatTime(record), "level": record.levelname,
               "logger": record.name, "pid": record.process, "message": record.getMessage()}
        requests = getattr(record, "requests", None)  # a handler's output, in a worker
        if requests is not None:
            doc["requests"] = requests
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def formatter(log_format: str) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else logging.Formatter(PLAIN)


def log_to_stderr(level: str, log_format: str) -> None:
    """A child process's logging: records to stderr (its log file), in the daemon's format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(log_format))
    logging.basicConfig(level=level, handlers=[handler], force=True)
