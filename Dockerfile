# nodedra: one pod per node (manifests/daemonset.yaml). Build from the repository root:
#   docker build -t nodedra:0.1.0 .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Only what the package is built from (setup.cfg reads README.md as the long description).
WORKDIR /src
COPY pyproject.toml setup.cfg README.md ./
COPY operator/ operator/
COPY grpc_gen/ grpc_gen/
RUN pip install --no-cache-dir . \
    && cd / && rm -rf /src \
    && nodedra version
WORKDIR /

# Root: the kubelet's plugin directories and sockets and the CDI directory belong to root.
# The DaemonSet drops every capability and makes the root filesystem read-only.
USER root
ENTRYPOINT ["nodedra"]
CMD ["run"]
