"""The errors a client can see, each with its HTTP status and its JSON ``type``.

Every failure a request can meet is one of these; the frontends map them to responses in one
place, and they cross process boundaries as ``(status, type, message)`` only.
"""

from __future__ import annotations

import json
import reprlib


class MservdError(Exception):
    """Base of every error that becomes a client answer."""

    http_status = 500
    type = "InternalServerError"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}

    def to_body(self) -> bytes:
        return error_body(self.http_status, self.type, self.message)


def error_body(status: int, type_: str, message: str) -> bytes:
    """The JSON every error answer carries: ``{"code", "type", "message"}``."""
    return json.dumps({"code": status, "type": type_, "message": message}).encode()


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 2, 60, 60


def short_repr(value: object) -> str:
    """A bounded repr for messages. A value read from a file or a request may be a huge
    structure (a YAML alias bomb is gigabytes as text), so a message never prints it whole."""
    return _SHORT.repr(value)


def error_message(body: bytes) -> str:
    """The message of an error answer: ``{"message": ...}``, v2's ``{"error": ...}``, OpenAI's
    ``{"error": {"message": ...}}``, or text."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return body.decode("utf-8", "replace")
    if isinstance(doc, dict):
        error = doc.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
        return str(doc.get("message") or error or doc)
    return str(doc)


class BadRequest(MservdError):
    http_status = 400
    type = "BadRequestException"


class Unauthorized(MservdError):
    http_status = 401
    type = "Unauthorized"


class Forbidden(MservdError):
    http_status = 403
    type = "InvalidModelVersionException"


class ModelNotFound(MservdError):
    http_status = 404
    type = "ModelNotFoundException"


class ModelVersionNotFound(ModelNotFound):
    """The model is registered, the version asked for is not (TorchServe's type for it)."""

    type = "ModelVersionNotFoundException"


class WorkflowNotFound(MservdError):
    http_status = 404
    type = "WorkflowNotFoundException"


class ResourceNotFound(MservdError):
    http_status = 404
    type = "ResourceNotFoundException"


class MethodNotAllowed(MservdError):
    http_status = 405
    type = "MethodNotAllowedException"


class Conflict(MservdError):
    http_status = 409
    type = "ConflictStatusException"


class RequestTooLarge(MservdError):
    http_status = 413
    type = "RequestEntityTooLarge"


class RequestTimeout(MservdError):
    """The client did not send its whole request in time."""

    http_status = 408
    type = "RequestTimeout"


class UnsupportedCoding(MservdError):
    """The body comes in a transfer coding the server does not undo (RFC 9112: 501)."""

    http_status = 501
    type = "NotImplemented"


class NoWorker(MservdError):
    """No live worker can take the request (all dead, loading, or the model failed)."""

    http_status = 503
    type = "ServiceUnavailableException"


class QueueFull(MservdError):
    """The model's bounded queue is full: the client should back off and retry."""

    http_status = 503
    type = "QueueFullException"


class SequenceRefused(MservdError):
    """A stateful model cannot take this request of a sequence: as many sequences are open as
    it allows (maxNumSequence), or this sequence's own queue is full (maxSequenceJobQueueSize).
    TorchServe answers both 503 ServiceUnavailableException. Without Retry-After: a frontend
    takes a 503 with it for overload and refuses the model's other requests for a moment,
    where this refusal is about one sequence, or about opening one."""

    http_status = 503
    type = "ServiceUnavailableException"


class DeadlineExceeded(MservdError):
    http_status = 504
    type = "RequestTimeoutException"


class WorkerDied(MservdError):
    http_status = 500
    type = "InternalServerException"

    def __init__(self, message: str = "Worker died.") -> None:
        super().__init__(message)

    @classmethod
    def after_parts(cls) -> WorkerDied:
        """A request whose worker died after it had streamed parts: never run again, since
        its client would get those parts twice (a generation replayed from its start)."""
        return cls("Worker died after this request had streamed part of its answer; it is "
                   "not run again, since its client would get those parts twice. Send the "
                   "request again for a whole answer.")

