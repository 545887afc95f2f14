# syntax=docker/dockerfile:1
# nodedra: one pod per node (manifests/daemonset.yaml). Build from the repository root:
#   docker build -t nodedra:0.2.0 .
# Without Docker (as root, e.g. on a test machine): python -m tests.peers.image builds the same
# image as an OCI archive for `ctr images import`, and `tox -e dockerfile` builds this file
# itself with buildah (tests/peers/dockerfile_image.py) and compares the two images.
#
# What goes into the image is in image/ and nowhere else: packages.txt (the Debian packages)
# and install.sh (nodedra's venv). tests/peers/image.py builds from the same two files with
# debootstrap and chroot, and tests/unit/test_image_recipe.py fails if this file installs
# anything else (a package named here, a pip install) or sets a different ENTRYPOINT, CMD or
# ENV than that build does.

# The Debian system with the packages of image/packages.txt (bookworm-slim is bookworm's
# minbase, as the other build's debootstrap --variant=minbase). --mount: image/ is read where
# it is, not copied into a layer. `packages=$(...)` fails the build if sed does, and `test`
# if the list is empty.
FROM debian:bookworm-slim AS base
RUN --mount=type=bind,source=image,target=/image \
    packages=$(sed -e 's/#.*//' /image/packages.txt) \
    && test -n "$packages" \
    && apt-get update \
    && apt-get install -y --no-install-recommends $packages \
    && rm -rf /var/lib/apt/lists/*

# The wheels of nodedra and its dependencies, and pip's (install.sh runs pip from its wheel),
# for CPython 3.11 on glibc 2.36: bookworm's. Only what the package is built from (setup.cfg
# reads README.md as the long description; the wheel carries LICENSE). This stage never
# reaches the image.
FROM python:3.11-slim-bookworm AS wheels
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml setup.cfg README.md LICENSE ./
COPY operator/ operator/
COPY grpc_gen/ grpc_gen/
RUN pip wheel --no-cache-dir --wheel-dir /wheels . pip

# The image: the base system, and install.sh's venv at /opt/nodedra built from the wheels
# (bound in, so neither they nor pip land in the image).
FROM base
RUN --mount=type=bind,source=image,target=/image \
    --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    sh /image/install.sh /wheels

ENV PATH=/opt/nodedra/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /

# Root: the kubelet's plugin directories and sockets and the CDI directory belong to root.
# The DaemonSet drops every capability and makes the root filesystem read-only.
USER root
ENTRYPOINT ["nodedra"]
CMD ["run"]
