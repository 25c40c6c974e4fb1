"""mservd's own gRPC service ``mservd.TrafficAPIs`` (protos/mservd_management.proto), on the
management port beside TorchServe's ``ManagementAPIs``: the REST API's traffic calls, each one
controller verb, answered with the REST API's JSON."""

from __future__ import annotations

import grpc

from mservd.frontends.grpc.generated import mservd_management_pb2 as pb
from mservd.frontends.grpc.generated import mservd_management_pb2_grpc as pb_grpc
from mservd.frontends.grpc.torchserve import ManagementAPIs


class TrafficAPIs(pb_grpc.TrafficAPIsServicer):
    def __init__(self, management: ManagementAPIs) -> None:
        self.management = management  # its way to the controller: tokens, errors, timeouts

    async def _call(self, op: str, args: dict, context: grpc.aio.ServicerContext
                    ) -> pb.TrafficResponse:
        answer = await self.management._manage(op, args, context)
        return pb.TrafficResponse(msg=answer.msg)

    async def SetTraffic(self, request: pb.SetTrafficRequest,
                         context: grpc.aio.ServicerContext) -> pb.TrafficResponse:
        return await self._call("set_traffic", {"model": request.model_name,
                                                "traffic": request.traffic_json}, context)

    async def DescribeTraffic(self, request: pb.DescribeTrafficRequest,
                              context: grpc.aio.ServicerContext) -> pb.TrafficResponse:
        return await self._call("describe_traffic", {"model": request.model_name}, context)

    async def ClearTraffic(self, request: pb.ClearTrafficRequest,
                           context: grpc.aio.ServicerContext) -> pb.TrafficResponse:
        return await self._call("clear_traffic", {"model": request.model_name}, context)
