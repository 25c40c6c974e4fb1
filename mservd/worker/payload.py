"""Turning request bytes into handler values and handler values into response bytes.

This module owns the TorchServe conventions for what a handler sees and what a client gets:
JSON bodies arrive parsed, ``text/*`` as ``str``, everything else as ``bytearray``; a handler's
``bytes`` go out as they are, ``str`` as UTF-8, anything else as JSON. It runs in the backend
worker (and in ``mservd run-handler``), never in the controller, which forwards bytes untouched.
"""

from __future__ import annotations

import codecs
import json
from typing import Any
from urllib.parse import parse_qsl

JSON_TYPE = "application/json"


class InputError(ValueError):
    """An input that cannot be turned into a handler value; its request alone is answered 400."""


def media_type(content_type: str | None) -> str:
    """The bare media type of a Content-Type value, lower-cased: ``text/plain; charset=x`` →
    ``text/plain``."""
    if not content_type:
        return ""
    return content_type.split(";", 1)[0].strip().lower()


def _charset(content_type: str) -> str:
    for part in content_type.split(";")[1:]:
        key, _, value = part.strip().partition("=")
        if key.lower() == "charset" and value:
            return value.strip('"')
    return "utf-8"


# Python codecs that are no charset: punycode decodes in time quadratic in its input (a 2 MB
# body held a worker for two minutes), and idna is built on it
NOT_CHARSETS = frozenset({"punycode", "idna"})


def _text_codec(content_type: str) -> str:
    """The codec of a text body's charset; LookupError for one Python lacks or is no charset."""
    name = codecs.lookup(_charset(content_type)).name
    if name in NOT_CHARSETS:
        raise LookupError(f"{name} is not a charset")
    return name


def decode_input(content_type: str | None, body: bytes) -> Any:
    """The value a handler receives for one input of the given content type.

    A JSON body that does not parse, or text in a charset that cannot decode it (unknown,
    ``undefined``, or the bytes are not in it), is passed on as ``bytearray`` rather than
    refused: the handler decides whether that is an error (TorchServe does the same). JSON
    nested too deeply to parse raises :class:`InputError`.
    """
    kind = media_type(content_type)
    if kind == JSON_TYPE or kind.endswith("+json"):
        try:
            return json.loads(body)
        except RecursionError:
            raise InputError("The JSON body is nested too deeply to parse.") from None
        except ValueError:  # UnicodeDecodeError included
            return bytearray(body)
    if kind.startswith("text/"):
        try:
            return bytes(body).decode(_text_codec(content_type or ""))
        except (ValueError, LookupError):  # UnicodeError (codec "undefined") is a ValueError
            return bytearray(body)
    return bytearray(body)


FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")
MAX_FORM_FIELDS = 1000  # fields of one form body; past it the request is answered 400


def is_form(content_type: str | None) -> bool:
    return media_type(content_type) in FORM_TYPES


def decode_form(content_type: str, body: bytes) -> list[tuple[str, str | None, bytes]]:
    """A form body's fields as (name, content type, bytes): each becomes one handler input.

    As TorchServe hands them on: a file part with its own content type, a plain field with
    none (so the handler gets its bytes, as sent, whatever decode_input_request says), an
    urlencoded field percent-decoded to bytes. Parsed here, in the worker, once the
    controller has checked the request's token: a stranger's form costs the frontend nothing
    but its bytes.
    """
    media = media_type(content_type)
    if media == FORM_TYPES[1]:
        fields = body.count(b"&") + 1
        if fields > MAX_FORM_FIELDS:
            raise InputError(f"The {media} body has {fields} fields; at most "
                             f"{MAX_FORM_FIELDS} are read.")
        # latin-1 both ways: each byte, percent-decoded or not, comes back as it was
        out: list[tuple[str, str | None, bytes]] = [
            (name.encode("latin-1").decode("utf-8", "replace"), None,
                value.encode("latin-1"))
               for name, value in parse_qsl(bytes(body).decode("latin-1"),
                                            keep_blank_values=True, encoding="latin-1")]
    else:
        out = _multipart_fields(content_type, bytes(body))
    if not out:
        raise InputError(f"The {media} body has no fields.")
    return out


def _multipart_fields(content_type: str, body: bytes) -> list[tuple[str, str | None, bytes]]:
    from werkzeug.http import parse_options_header
    from werkzeug.sansio.multipart import Data, Epilogue, Field, File, MultipartDecoder

    boundary = parse_options_header(content_type)[1].get("boundary")
    if not boundary:
        raise InputError("Malformed multipart/form-data body: its Content-Type has no boundary.")
    decoder = MultipartDecoder(boundary.encode("latin-1"), max_parts=MAX_FORM_FIELDS)
    out: list[tuple[str, str | None, bytes]] = []
    parts: list[bytes] = []
    try:
        decoder.receive_data(body)
        decoder.receive_data(None)
        while not isinstance(event := decoder.next_event(), Epilogue):
            if isinstance(event, (Field, File)):
                # a file part with its content type; a plain field with none, as TorchServe
                kind = (event.headers.get("content-type", "application/octet-stream")
                        if isinstance(event, File) else None)
                out.append((event.name, kind, b""))
                parts = []
            elif isinstance(event, Data):
                parts.append(event.data)
                if not event.more_data:
                    name, kind, _ = out[-1]
                    out[-1] = (name, kind, b"".join(parts))
            elif type(event).__name__ == "NeedData":  # the body ended inside a part
                raise ValueError("the body ends before its closing boundary")
    except Exception as exc:  # werkzeug raises several types for malformed or huge forms
        if isinstance(exc, InputError):
            raise
        raise InputError(f"Malformed multipart/form-data body: {exc}") from None
    return out


def encode_output(item: Any, content_type: str | None = None) -> tuple[bytes, str]:
    """The body bytes and Content-Type for one handler output item.

    ``content_type`` is what the handler set for this request, if anything; it wins.
    """
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item), content_type or "application/octet-stream"
    if isinstance(item, str):
        return item.encode("utf-8"), content_type or "text/plain; charset=utf-8"
    return json.dumps(item, default=json_default).encode("utf-8"), content_type or JSON_TYPE


def json_default(value: Any) -> Any:
    """Tensors and NumPy values are what handlers most often return by accident."""
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
