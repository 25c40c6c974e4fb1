"""TorchServe's conventions for what a handler sees and what a client gets."""

from __future__ import annotations

from mservd.payload import decode_input, encode_output


def test_payload_json_is_parsed_text_is_str_and_the_rest_is_bytearray() -> None:
    assert decode_input("application/json", b'{"a": [1, 2]}') == {"a": [1, 2]}
    assert decode_input("text/plain; charset=latin-1", "é".encode("latin-1")) == "é"
    assert decode_input("image/png", b"\x89PNG") == bytearray(b"\x89PNG")
    assert decode_input(None, b"raw") == bytearray(b"raw")


def test_payload_bad_json_is_passed_on_as_bytes_for_the_handler_to_judge() -> None:
    assert decode_input("application/json", b"{nope") == bytearray(b"{nope")


def test_payload_punycode_and_idna_are_no_charset_and_leave_the_body_as_bytes() -> None:
    # punycode decodes in time quadratic in its input: 2 MB held a worker for two minutes
    body = b"a" * 1000 + b"-" + b"99" * 500
    for charset in ("punycode", "PUNYCODE", "idna"):
        assert decode_input(f"text/plain; charset={charset}", body) == bytearray(body)
    assert decode_input("text/plain; charset=utf-8", body) == body.decode()


def test_payload_outputs_bytes_as_is_str_as_utf8_and_the_rest_as_json() -> None:
    assert encode_output(b"\x00\x01") == (b"\x00\x01", "application/octet-stream")
    assert encode_output("hé") == ("hé".encode(), "text/plain; charset=utf-8")
    assert encode_output({"a": 1}) == (b'{"a": 1}', "application/json")
    assert encode_output([1], "application/x-custom")[1] == "application/x-custom"
