"""nodedra: a Kubernetes DRA driver for a node's own CPUs and memory."""

__version__ = "0.2.0"
