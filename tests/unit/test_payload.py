"""TorchServe's conventions for what a handler sees and what a client gets."""

from __future__ import annotations

import pytest

from mservd.worker.payload import InputError, decode_form, decode_input, encode_output


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


def test_a_forms_fields_are_the_bytes_sent_as_torchserve_hands_them_on() -> None:
    body = (b'--b\r\nContent-Disposition: form-data; name="data"\r\n\r\n\xff\xfe\x00bin'
            b'\r\n--b\r\nContent-Disposition: form-data; name="text"\r\n'
            b'Content-Type: text/plain; charset=latin-1\r\n\r\ncaf\xe9'
            b'\r\n--b\r\nContent-Disposition: form-data; name="img"; filename="x.png"\r\n'
            b'Content-Type: image/png\r\n\r\nPNG\r\n--b--\r\n')
    # a plain field has no content type (the handler gets its bytes); a file part keeps its own
    assert decode_form("multipart/form-data; boundary=b", body) == [
        ("data", None, b"\xff\xfe\x00bin"), ("text", None, b"caf\xe9"),
        ("img", "image/png", b"PNG")]
    assert decode_form("application/x-www-form-urlencoded", b"data=%FF%FE&x=1&x=2&e=") == [
        ("data", None, b"\xff\xfe"), ("x", None, b"1"), ("x", None, b"2"), ("e", None, b"")]
    assert decode_input(None, b"caf\xe9") == bytearray(b"caf\xe9")


@pytest.mark.parametrize(("content_type", "body", "says"), [
    ("multipart/form-data; boundary=b", b"--b\r\nnonsense", "Malformed multipart"),
    ("multipart/form-data", b"--b\r\n", "has no boundary"),
    ("multipart/form-data; boundary=b", b"--b--\r\n", "has no fields"),
    ("application/x-www-form-urlencoded", b"&".join([b"f=1"] * 1001), "at most 1000"),
])
def test_a_malformed_form_is_refused_saying_why(content_type, body, says) -> None:
    with pytest.raises(InputError, match=says):
        decode_form(content_type, body)
