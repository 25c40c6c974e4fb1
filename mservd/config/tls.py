"""TLS for the HTTP and gRPC frontends, from TorchServe's keys: an ``https://`` address, or
``enable_grpc_ssl=true``, serves with ``certificate_file`` and ``private_key_file`` (PEM).

The daemon checks the files at start (:func:`needs`, :func:`server_context`), so a missing or
mismatched key fails ``mservd start`` with its reason rather than every handshake later; the
HTTP workers each build their own context from the same files (``frontends/http/arbiter.py``),
the gRPC frontend its credentials. The client commands trust the daemon's certificate too
(:func:`client_context`), so a self-signed one works on loopback.
"""

from __future__ import annotations

import ssl

from mservd.config import Settings, parse_address

HTTP_ADDRESSES = ("inference_address", "management_address", "metrics_address")


def tls_apis(settings: Settings) -> list[str]:
    """The HTTP APIs (``inference``, ``management``, ``metrics``) whose address is https."""
    return [key.split("_")[0] for key in HTTP_ADDRESSES
            if parse_address(getattr(settings, key))[0] == "https"]


def needs(settings: Settings) -> bool:
    """Whether anything is served over TLS; raises ValueError when so but the files are not
    both set (TorchServe's keystore is Java's: it is not read)."""
    wanted = [f"{api}_address" for api in tls_apis(settings)]
    if settings.enable_grpc_ssl:
        wanted.append("enable_grpc_ssl=true")
    if not wanted:
        return False
    if not (settings.certificate_file and settings.private_key_file):
        raise ValueError(
            f"{', '.join(wanted)} needs certificate_file and private_key_file (PEM) in "
            "config.properties. A keystore (keystore=) is not read: export it with "
            "'openssl pkcs12 -in KEYSTORE -nodes' into the two files.")
    return True


def server_context(certificate_file: str, private_key_file: str) -> ssl.SSLContext:
    """A server's TLS context with the certificate chain and its key; ValueError naming the
    files when they cannot be read or do not belong together."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(certificate_file, private_key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"Cannot serve TLS with certificate_file {certificate_file!r} and "
                         f"private_key_file {private_key_file!r}: {exc}") from None
    return context


def client_context(certificate_file: str | None) -> ssl.SSLContext:
    """A client's context that trusts the system's authorities and, when given, the daemon's
    own certificate (a self-signed one is its own authority)."""
    context = ssl.create_default_context()
    if certificate_file:
        context.load_verify_locations(certificate_file)
    return context
