"""The errors a handler raises or returns.

This module owns the two ways a handler reports failure, and nothing else:

* raising :class:`PredictionException` (TorchServe's ``ts.utils.util.PredictionException``)
  fails the whole batch with its ``error_code``;
* putting a :class:`RequestError` value at a request's position in the output list fails only
  that request (the worker turns it into ``{"code": status, "type": type, "message": message}``).

:class:`BadInputError` is the one a built-in raises from ``decode_request`` when a request cannot
be decoded; the batching code turns it into a ``RequestError`` for that request alone.
"""

from __future__ import annotations

from dataclasses import dataclass


class PredictionException(Exception):
    """A handler failure with an HTTP status, compatible with TorchServe's class of this name.

    :param message: what failed, shown to the client.
    :param error_code: the HTTP status the client gets; 500 unless the handler knows better.
    """

    def __init__(self, message: str, error_code: int = 500) -> None:
        self.message = message
        self.error_code = error_code
        super().__init__(message)

    def __str__(self) -> str:
        # TorchServe's format; logs and user code written for TorchServe may parse it.
        return f"{self.message} : {self.error_code}"


class BadInputError(PredictionException):
    """A request that cannot be decoded: not an image, not text, a JSON body of the wrong shape."""

    def __init__(self, message: str, error_code: int = 400) -> None:
        super().__init__(message, error_code)


@dataclass(frozen=True)
class RequestError:
    """The output value that fails one request of a batch and leaves the others alone.

    :param status: the HTTP status for this request.
    :param message: what was wrong with it, shown to the client.
    :param type: the ``type`` field of the JSON error body.
    """

    status: int
    message: str
    type: str = "BadInput"

    @classmethod
    def from_exception(cls, exc: BaseException) -> RequestError:
        """The ``RequestError`` for an exception raised while handling one request.

        A :class:`PredictionException` keeps its ``error_code`` and ``message``; any other
        exception becomes a 500 naming the exception type.
        """
        if isinstance(exc, PredictionException):
            kind = "BadInput" if 400 <= exc.error_code < 500 else "InternalServerException"
            return cls(exc.error_code, exc.message, kind)
        return cls(500, f"{type(exc).__name__}: {exc}", "InternalServerException")
