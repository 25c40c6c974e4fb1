# mservd serving image: `mservd start --foreground` as the container's process, as KServe's
# ClusterServingRuntime (deploy/kserve/clusterservingruntime.yaml) and `docker run` expect.
#
#   docker build -t mservd:0.1.0 .
#   docker run --rm -p 8080:8080 -p 7070:7070 -p 8082:8082 \
#       -v "$PWD/mnt-models:/mnt/models:ro" mservd:0.1.0
# where mnt-models/ holds config/config.properties (deploy/kserve/config/) and model-store/.
#
# Base: pinned by full version tag. Pin the digest too when you build for production:
#   docker buildx imagetools inspect python:3.11.7-slim-bookworm   ->  FROM python:...@sha256:...
# torch comes from PyPI's default wheels (on x86_64 Linux they carry CUDA, so one image
# serves CPU and GPU nodes). For a smaller CPU-only image, install torch first from the
# PyTorch CPU wheel index; for GPUs, request nvidia.com/gpu in the InferenceService and keep
# this image (the NVIDIA container runtime provides the driver).
FROM python:3.11.7-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Non-root, with the uid KServe's runtimes run as (runAsUser: 1000).
RUN groupadd --system --gid 1000 mservd \
 && useradd --system --uid 1000 --gid mservd --create-home --home-dir /home/mservd \
        --shell /usr/sbin/nologin mservd

WORKDIR /opt/mservd
COPY pyproject.toml README.md ./
COPY mservd ./mservd
COPY handlers ./handlers
COPY archiver ./archiver
RUN pip install --no-cache-dir . \
 && rm -rf /opt/mservd

# logs/ (and the readiness probe's logs/mservd.state.json) live under the home directory.
WORKDIR /home/mservd
USER 1000:1000

# HTTP inference (v2 REST, /predictions), gRPC inference, Prometheus metrics. Management
# (8081) listens on loopback only in deploy/kserve/config/config.properties.
EXPOSE 8080 7070 8082

# `docker stop` / Kubernetes send SIGTERM: mservd stops accepting, answers what it accepted
# (up to drain_timeout), stops its workers and exits 0. mservd is PID 1 and waits for its own
# children; run with `docker run --init` to have stray grandchildren reaped as well.
STOPSIGNAL SIGTERM
ENTRYPOINT ["mservd", "start", "--foreground"]
# The KServe runtime's args (the same list; a test keeps them equal).
CMD ["--model-store=/mnt/models/model-store", "--ts-config=/mnt/models/config/config.properties", "--grpc-port=7070", "--disable-token-auth", "--ncs"]
