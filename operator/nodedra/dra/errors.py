"""Errors of the kubelet plugin that callers tell apart."""

from __future__ import annotations


class RecoverableError(Exception):
    """A background failure that is retried by itself, such as publishing ResourceSlices.

    :meth:`nodedra.dra.Plugin.handle_error` only logs these; anything else it is handed is
    fatal and shuts the owner down.
    """

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.__cause__ = cause


class NotServingClaimsError(RuntimeError):
    """The plugin refuses a whole kubelet request: it does not serve claims (yet)."""


class HealthNotSupportedError(NotImplementedError):
    """The plugin does not report device health (see ``Plugin.watch_health_status``)."""
