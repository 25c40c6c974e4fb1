"""The Open Inference Protocol v2 (KServe / Triton): the body codec, model metadata, and the
worker-side bridge between v2 requests and handlers. See docs/v2.md."""
