#!/bin/sh
# Install nodedra into the image: a venv at /opt/nodedra made with the image's own Python
# (Debian's python3.11, from image/packages.txt), filled from a directory of wheels (nodedra's
# and those of its dependencies, for CPython 3.11 on glibc 2.36, and pip's) and never from an
# index, so installing needs no network and installs exactly the wheels it was given.
#
# Runs as root inside the image's root filesystem: a RUN of the Dockerfile, or chroot from
# tests/peers/image.py (python -m tests.peers.image). Usage: install.sh WHEEL_DIR
set -eu

wheels=${1:?usage: install.sh WHEEL_DIR (a directory of wheels: nodedra, its dependencies, pip)}
venv=/opt/nodedra

# pip runs from its wheel (as pip's documentation says one bootstraps it), installing into the
# venv whose interpreter runs it: the image gets no pip, and needs no python3.11-venv.
set -- "$wheels"/pip-*.whl
if [ $# -ne 1 ] || [ ! -f "$1" ]; then
    echo "install.sh: $wheels must hold exactly one pip wheel (pip-*.whl), found: $*" >&2
    exit 1
fi
pip_wheel=$1

# Hash-based .pyc files (py_compile picks them when SOURCE_DATE_EPOCH is set): they stay valid
# whatever timestamps the layer's files end up with, so a build may fix those (reproducible
# layers), and a read-only root filesystem still never recompiles.
export SOURCE_DATE_EPOCH=0
export PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_ROOT_USER_ACTION=ignore

python3.11 -m venv --without-pip "$venv"
"$venv/bin/python" "$pip_wheel/pip" install --quiet --no-index --find-links "$wheels" nodedra

# What the installation may leave behind that the image needs not.
rm -rf /root/.cache

# The image works: its own nodedra, on its own interpreter.
out=$("$venv/bin/nodedra" version)
case $out in
    "nodedra "*) echo "install.sh: installed $out in $venv" ;;
    *) echo "install.sh: $venv/bin/nodedra version printed '$out'" >&2; exit 1 ;;
esac
