"""Our answers' HTTP statuses as gRPC status codes: the one place the mapping lives."""

from __future__ import annotations

import grpc

_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,  # e.g. registration disabled (--enable-model-api)
    409: grpc.StatusCode.ALREADY_EXISTS,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,  # larger than max_request_size
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
    507: grpc.StatusCode.RESOURCE_EXHAUSTED,  # out of memory
}


def status_code(http_status: int) -> grpc.StatusCode:
    """The gRPC code of an HTTP status: 4xx/5xx not listed become INVALID_ARGUMENT/INTERNAL."""
    code = _CODES.get(http_status)
    if code is not None:
        return code
    return grpc.StatusCode.INVALID_ARGUMENT if 400 <= http_status < 500 \
        else grpc.StatusCode.INTERNAL
