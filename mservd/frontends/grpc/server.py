"""The gRPC frontend process: TorchServe's services and v2's ``GRPCInferenceService``.

Stateless like the HTTP frontend: every RPC becomes a controller message over the same ZeroMQ
endpoint. Two grpc.aio servers on 127.0.0.1: the inference port serves
``InferenceAPIsService`` and ``inference.GRPCInferenceService``, the management port
``ManagementAPIsService`` and mservd's own ``mservd.TrafficAPIs`` (``traffic.py``). Ports may be 0; once bound, the process writes the addresses to
``ports_file`` (atomically) so the daemon can put them in its state file.

Run as ``python -m mservd.frontends.grpc.server SPEC_JSON``; the daemon writes the spec. TERM
stops it after in-flight calls finish (up to ``drain_timeout``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path

import grpc

from mservd import protocol
from mservd.frontends.async_bridge import AsyncBridge
from mservd.frontends.grpc.generated import (
    grpc_predict_v2_pb2_grpc,
    inference_pb2_grpc,
    management_pb2_grpc,
    mservd_management_pb2_grpc,
)
from mservd.frontends.grpc.strangers import RefuseStrangers
from mservd.frontends.grpc.torchserve import InferenceAPIs, ManagementAPIs
from mservd.frontends.grpc.traffic import TrafficAPIs
from mservd.frontends.grpc.undecodable import RefuseUndecodable
from mservd.frontends.grpc.v2 import GRPCInferenceService
from mservd.process.log_format import log_to_stderr
from mservd.specs import GrpcFrontendSpec

log = logging.getLogger("mservd.frontends.grpc")

# the inference port's methods whose messages carry inputs, and a token: asked about first
PREDICTIONS = ("/org.pytorch.serve.grpc.inference.InferenceAPIsService/Predictions",
               "/org.pytorch.serve.grpc.inference.InferenceAPIsService/StreamPredictions",
               "/org.pytorch.serve.grpc.inference.InferenceAPIsService/StreamPredictions2",
               "/inference.GRPCInferenceService/ModelInfer")


def _bind(server: grpc.aio.Server, host: str, port: int, what: str,
          credentials: grpc.ServerCredentials | None) -> int:
    address = f"{host}:{port}"
    bound = (server.add_insecure_port(address) if credentials is None
             else server.add_secure_port(address, credentials))
    if bound == 0:
        raise OSError(f"Cannot listen on {what} {host}:{port}; is another server using it? "
                      f"Set another {what} in config.properties.")
    return bound


async def serve(spec: GrpcFrontendSpec) -> None:
    host = spec.host
    # management binds where the REST management API does (loopback unless configured)
    mhost = spec.management_host
    max_size = spec.max_request_size
    options = [("grpc.max_receive_message_length", max_size),
               ("grpc.max_send_message_length", spec.max_response_size),
               # a stranger's connections are bounded as the HTTP ports bound them: past the
               # cap closed at once, and one that never sends its HTTP/2 settings (or never
               # ends its TLS handshake) closed at the deadline, not gRPC's 120 s
               ("grpc.max_allowed_incoming_connections", spec.connections),
               ("grpc.server_handshake_timeout_ms", round(spec.handshake_timeout * 1000))]
    bridge = AsyncBridge(spec.controller, spec.unknown_token_limit)
    timeout = spec.reply_timeout
    inference_guards, management_guards = [], []
    if spec.auth:  # a stranger's call is refused before its message is read
        inference_guards = [RefuseStrangers(bridge, protocol.API_INFERENCE, PREDICTIONS)]
        management_guards = [RefuseStrangers(bridge, protocol.API_MANAGEMENT)]
    inference = grpc.aio.server(options=options,
                                interceptors=[*inference_guards, RefuseUndecodable()])
    inference_pb2_grpc.add_InferenceAPIsServiceServicer_to_server(
        InferenceAPIs(bridge, timeout, spec.auth, spec.write_timeout, spec.traffic_key_header),
        inference)
    grpc_predict_v2_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
        GRPCInferenceService(bridge, timeout, spec.auth, spec.traffic_key_header), inference)
    management = grpc.aio.server(options=options,
                                 interceptors=[*management_guards, RefuseUndecodable()])
    management_apis = ManagementAPIs(bridge, spec.auth)
    management_pb2_grpc.add_ManagementAPIsServiceServicer_to_server(management_apis, management)
    mservd_management_pb2_grpc.add_TrafficAPIsServicer_to_server(TrafficAPIs(management_apis),
                                                                 management)
    credentials = None
    if spec.certificate_file:  # enable_grpc_ssl (mservd/config/tls.py checked the files at start)
        credentials = grpc.ssl_server_credentials([(
            Path(spec.private_key_file).read_bytes(), Path(spec.certificate_file).read_bytes())])
    inference_port = _bind(inference, host, spec.inference_port, "grpc_inference_port",
                           credentials)
    management_port = _bind(management, mhost, spec.management_port, "grpc_management_port",
                            credentials)
    ports = {"inference": f"{host}:{inference_port}", "management": f"{mhost}:{management_port}"}
    await inference.start()
    await management.start()
    target = Path(spec.ports_file)
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(ports))
    tmp.replace(target)
    log.info("gRPC frontend (pid %d) serving %s", os.getpid(), ports)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    grace = spec.drain_timeout
    log.info("gRPC frontend stopping (up to %.0f s for calls in flight)", grace)
    await asyncio.gather(inference.stop(grace), management.stop(grace))
    bridge.close()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    spec = GrpcFrontendSpec.from_json(argv[0])
    log_to_stderr(spec.log_level, spec.log_format)
    try:
        from mservd.process.lifeline import die_with_parent

        die_with_parent(signal.SIGTERM)
    except ImportError:
        pass
    try:
        asyncio.run(serve(spec))
    except OSError as exc:
        log.error("%s", exc)
        return 4
    return 0


if __name__ == "__main__":
    sys.exit(main())
