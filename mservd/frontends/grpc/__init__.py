"""The gRPC frontend: TorchServe's inference and management services and the Open Inference
Protocol v2 ``inference.GRPCInferenceService``, in one stateless process (see server.py)."""
