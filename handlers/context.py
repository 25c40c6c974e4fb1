"""The ``Context`` a handler receives, compatible with TorchServe's ``ts.context.Context``.

This module owns what a handler can learn about its model (name, manifest, directory, device,
batch size, ``model_yaml_config``) and about the requests of the current batch (ids, headers),
and what it can say back per request (status, reason, headers, content type). It does no IO:
the backend worker fills it with :meth:`Context.begin_batch` and reads it back with
:meth:`Context.response_meta`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, overload

from handlers.metrics import MetricsRecorder

logger = logging.getLogger(__name__)

SERVER_NAME = "mservd"

StreamCallback = Callable[[int, Any], None]

_T = TypeVar("_T")


@dataclass(frozen=True)
class ResponseMeta:
    """What the handler set for one request.

    :param headers: response headers other than Content-Type, as the handler spelled them.
    :param content_type: the Content-Type the handler set, or ``None`` to let the worker choose.
    """

    status: int
    reason: str | None
    headers: dict[str, str]
    content_type: str | None


class RequestHeaders(dict[str, str]):
    """A request's headers under lower-case names, found by any case: a handler written for
    TorchServe may look up ``headers["X-Foo"]`` as its client spelled it."""

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower() if isinstance(key, str) else key)

    @overload
    def get(self, key: str, default: None = None) -> str | None: ...
    @overload
    def get(self, key: str, default: str) -> str: ...
    @overload
    def get(self, key: str, default: _T) -> str | _T: ...
    def get(self, key: str, default: object = None) -> object:
        return super().get(key.lower() if isinstance(key, str) else key, default)

    def __contains__(self, key: object) -> bool:
        return super().__contains__(key.lower() if isinstance(key, str) else key)


class RequestProcessor:
    """One request's headers in, and status and headers out (TorchServe's ``RequestProcessor``).

    Request header names are matched case-insensitively, as HTTP and gRPC metadata are.
    """

    def __init__(self, request_headers: Mapping[str, str] | None = None) -> None:
        self._request_headers = RequestHeaders(
            (k.lower(), v) for k, v in (request_headers or {}).items())
        self._status_code = 200
        self._reason_phrase: str | None = None
        self._response_headers: dict[str, str] = {}

    def get_request_header(self, key: str) -> str | None:
        return self._request_headers.get(key)

    def get_request_headers(self) -> dict[str, str]:
        return self._request_headers

    # TorchServe's names for the two above.
    get_request_property = get_request_header
    get_request_properties = get_request_headers

    def report_status(self, code: int, reason_phrase: str | None = None) -> None:
        self._status_code = int(code)
        self._reason_phrase = reason_phrase

    def get_response_status_code(self) -> int:
        return self._status_code

    def get_response_status_phrase(self) -> str | None:
        return self._reason_phrase

    def add_response_property(self, key: str, value: str) -> None:
        self._response_headers[key] = value

    def get_response_headers(self) -> dict[str, str]:
        return self._response_headers

    def get_response_header(self, key: str) -> str | None:
        wanted = key.lower()
        for name, value in self._response_headers.items():
            if name.lower() == wanted:
                return value
        return None


class Context:
    """Model facts for the handler's life, request facts for the current batch.

    The constructor matches TorchServe's, plus ``model_yaml_config``.

    :param gpu: the GPU index the worker was given, or ``None`` for CPU.
    :param mms_version: the server version reported in ``system_properties``.
    :param metrics: the recorder handlers write to; a fresh :class:`MetricsRecorder` when ``None``.
    :param model_yaml_config: the model-config.yaml contents; ``{}`` when there is none.
    """

    def __init__(
        self,
        model_name: str,
        model_dir: str,
        manifest: dict[str, Any] | None,
        batch_size: int,
        gpu: int | None,
        mms_version: str,
        limit_max_image_pixels: bool = True,
        metrics: Any = None,
        model_yaml_config: dict[str, Any] | None = None,
    ) -> None:
        self.model_name = model_name
        self.manifest = manifest if manifest is not None else {}
        self._system_properties: dict[str, Any] = {
            "model_dir": model_dir,
            "gpu_id": gpu,
            "batch_size": batch_size,
            "server_name": SERVER_NAME,
            "server_version": mms_version,
            "limit_max_image_pixels": limit_max_image_pixels,
        }
        self.metrics = metrics if metrics is not None else MetricsRecorder(model_name)
        self.model_yaml_config: dict[str, Any] = model_yaml_config or {}
        self.request_ids: dict[int, str] = {}
        self.request_processor: list[RequestProcessor] = []
        # Set by the worker when the transport can stream; see handlers.streaming.
        self.stream_callback: StreamCallback | None = None
        # decode_input_request: TorchServe inputs parsed (JSON, text), or as the bytes sent
        self.decode_input_request = True
        # a stateful model's sequence headers (sequenceBatching), under TorchServe's names
        self.header_key_sequence_id = "ts_request_sequence_id"
        self.header_key_sequence_start = "ts_request_sequence_start"
        self.header_key_sequence_end = "ts_request_sequence_end"

    @property
    def system_properties(self) -> dict[str, Any]:
        return self._system_properties

    # --- per batch, called by the worker -------------------------------------------------

    def begin_batch(self, request_ids: list[str], headers: list[dict[str, str]]) -> None:
        """Start a batch: one id and one header dict per request, in the order of ``data``.

        Everything a handler set for the previous batch is forgotten.
        """
        if len(request_ids) != len(headers):
            raise ValueError(
                f"begin_batch got {len(request_ids)} request ids but {len(headers)} header "
                "dicts; pass one header dict per request (an empty dict when it has none)."
            )
        self.request_ids = dict(enumerate(request_ids))
        self.request_processor = [RequestProcessor(h) for h in headers]

    def response_meta(self, idx: int) -> ResponseMeta:
        """What the handler set for request ``idx`` of the current batch."""
        processor = self.request_processor[idx]
        headers = {
            k: v for k, v in processor.get_response_headers().items() if k.lower() != "content-type"
        }
        return ResponseMeta(
            status=processor.get_response_status_code(),
            reason=processor.get_response_status_phrase(),
            headers=headers,
            content_type=processor.get_response_header("content-type"),
        )

    def send_intermediate(self, idx: int, item: Any) -> None:
        """Send one intermediate (streamed) response for request ``idx`` of the current batch."""
        if self.stream_callback is None:
            raise RuntimeError(
                f"Model {self.model_name!r} tried to stream a response, but this worker has no "
                "streaming transport; streaming needs a request that accepts chunked responses."
            )
        self.stream_callback(idx, item)

    # --- TorchServe's helpers --------------------------------------------------------------

    def get_request_id(self, idx: int = 0) -> str | None:
        return self.request_ids.get(idx)

    def get_request_header(self, idx: int, key: str) -> str | None:
        return self.request_processor[idx].get_request_header(key)

    def get_sequence_id(self, idx: int) -> str | None:
        """The sequence request ``idx`` belongs to (a stateful model's): the client's
        ``ts_request_sequence_id``, or the one the server opened for it."""
        return self.request_processor[idx].get_request_header(self.header_key_sequence_id)

    def get_all_request_header(self, idx: int) -> dict[str, str]:
        return self.request_processor[idx].get_request_headers()

    def set_response_content_type(self, idx: int, value: str) -> None:
        self.set_response_header(idx, "content-type", value)

    def get_response_content_type(self, idx: int) -> str | None:
        return self.request_processor[idx].get_response_header("content-type")

    def get_response_status(self, idx: int) -> tuple[int, str | None]:
        processor = self.request_processor[idx]
        return processor.get_response_status_code(), processor.get_response_status_phrase()

    def set_response_status(self, code: int = 200, phrase: str = "", idx: int = 0) -> None:
        if idx < len(self.request_processor):
            self.request_processor[idx].report_status(code, phrase)

    def set_all_response_status(self, code: int = 200, phrase: str = "") -> None:
        for processor in self.request_processor:
            processor.report_status(code, phrase)

    def get_response_headers(self, idx: int) -> dict[str, str]:
        return self.request_processor[idx].get_response_headers()

    def set_response_header(self, idx: int, key: str, value: str) -> None:
        self.request_processor[idx].add_response_property(key, value)
