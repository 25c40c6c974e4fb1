"""A trivial HTTP/1.1 server that answers every request with a constant: the client's ceiling.

Measuring the load generator against this server (in its own process, so it has its own core
on a 2-core machine) shows how many requests/s the client itself can drive; a system measured
near that number is client-bound, not server-bound.

    python -m benchmarks.trivial_server [--port 0]   # prints "PORT <n>" once listening
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

BODY = b"[0.0]"
ANSWER = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
          + str(len(BODY)).encode() + b"\r\nConnection: keep-alive\r\n\r\n" + BODY)


class _Server(asyncio.Protocol):
    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport
        self.buf = bytearray()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        out = []
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = bytes(buf[:end]).lower()
            length = 0
            at = head.find(b"content-length:")
            if at >= 0:
                length = int(head[at + 15:].split(b"\r\n", 1)[0])
            if len(buf) < end + 4 + length:
                break
            del buf[:end + 4 + length]
            out.append(ANSWER)
        if out:
            self.transport.write(b"".join(out))


async def serve(port: int, ready=None) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Server, "127.0.0.1", port, backlog=2048)
    bound = server.sockets[0].getsockname()[1]
    if ready is not None:
        ready(bound)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    from benchmarks.loadgen import install_fast_loop

    install_fast_loop()

    def ready(port: int) -> None:
        sys.stdout.write(f"PORT {port}\n")
        sys.stdout.flush()

    try:
        asyncio.run(serve(args.port, ready))
    except KeyboardInterrupt:
        pass
    os._exit(0)


if __name__ == "__main__":
    main()
