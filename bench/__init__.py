"""Benchmarks of nodedra against the real Kubernetes peers, side by side with the Go peer.

Run ``python -m bench`` (or ``tox -e bench``); see bench/README.md. Not part of the tests.
"""
