"""Settings of ``nodedra run``: flags over environment variables over defaults."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from nodedra.settings import (
    FLAGS,
    Settings,
    SettingsError,
    add_arguments,
    load_settings,
    split_address,
    to_environ,
)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults() -> None:
    settings = load_settings(parse(), {"NODE_NAME": "n1"})
    assert settings == Settings(node_name="n1")
    assert settings.watch_claims is True
    assert settings.release_orphans is False
    assert settings.config_required is False
    assert settings.allow_whole_numa_node_devices is False


def test_flags_win_over_environment() -> None:
    environ = {"NODE_NAME": "from-env", "NODEDRA_LOG_FORMAT": "json", "NODEDRA_CDI_DIR": "/env"}
    settings = load_settings(parse("--node-name", "from-flag", "--cdi-dir", "/flag"), environ)
    assert (settings.node_name, settings.log_format, settings.cdi_dir) == (
        "from-flag",
        "json",
        Path("/flag"),
    )


def test_every_setting_has_an_environment_variable() -> None:
    environ = {
        "NODE_NAME": "n",
        "KUBECONFIG": "/k",
        "NODEDRA_REGISTRY_DIR": "/r",
        "NODEDRA_PLUGIN_DIR": "/p",
        "NODEDRA_CDI_DIR": "/c",
        "NODEDRA_STATE_DIR": "/s",
        "NODEDRA_CONFIG": "/cfg.yaml",
        "NODEDRA_SYSFS": "/sysfs",
        "POD_UID": "uid-1",
        "NODEDRA_LOG_LEVEL": "debug",
        "NODEDRA_LOG_FORMAT": "json",
        "NODEDRA_METRICS_ADDRESS": "127.0.0.1:1",
        "NODEDRA_HEALTH_ADDRESS": "",
        "NODEDRA_STATUS_ADDRESS": "",
        "NODEDRA_WATCH_CLAIMS": "false",
        "NODEDRA_RELEASE_ORPHANS": "yes",
        "NODEDRA_ORPHAN_GRACE": "5",
        "NODEDRA_CONFIG_POLL": "0.5",
        "NODEDRA_RESYNC_PERIOD": "2",
        "NODEDRA_PINNING": "best-effort",
        "NODEDRA_NRI_SOCKET": "/run/nri.sock",
        "NODEDRA_NRI_INDEX": "07",
        "NODEDRA_ALLOW_WHOLE_NUMA_NODE_DEVICES": "true",
        "NODEDRA_KUBELET_CPU_MANAGER_STATE": "/kubelet/cpu_manager_state",
        "NODEDRA_KUBELET_CONFIG": "/kubelet/config.yaml",
        "NODEDRA_IRQ_DIR": "/host/proc/irq",
        "NODEDRA_WORKQUEUE_DIR": "/host/wq",
        "NODEDRA_SYSTEM_BUS": "/host/bus",
        "NODEDRA_IRQBALANCE_DIR": "/host/run/irqbalance",
    }
    assert {f.env for f in FLAGS} == set(environ)
    settings = load_settings(None, environ)
    assert settings.health_address == settings.status_address == ""
    assert settings.watch_claims is False
    assert settings.release_orphans is True
    assert settings.config_required is True
    assert settings.orphan_grace == 5.0
    assert settings.allow_whole_numa_node_devices is True
    assert (settings.pinning, settings.nri_socket, settings.nri_index) == (
        "best-effort",
        Path("/run/nri.sock"),
        "07",
    )
    assert (settings.kubelet_cpu_manager_state, settings.kubelet_config) == (
        Path("/kubelet/cpu_manager_state"),
        Path("/kubelet/config.yaml"),
    )
    assert (settings.irq_dir, settings.workqueue_dir) == (Path("/host/proc/irq"), Path("/host/wq"))
    assert settings.system_bus == Path("/host/bus")
    assert settings.irqbalance_dir == Path("/host/run/irqbalance")
    assert load_settings(None, to_environ(settings)) == settings


def test_the_cpu_map_is_served_on_localhost_by_default() -> None:
    """It names the node's pods and claims: not for every pod of the cluster network."""
    settings = load_settings(None, {"NODE_NAME": "n"})
    assert split_address(settings.status_address) == ("127.0.0.1", 9465)
    assert settings.status_address != settings.metrics_address


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({}, "no node name: pass --node-name or set NODE_NAME"),
        ({"NODE_NAME": ""}, "no node name"),
        ({"NODE_NAME": "n", "NODEDRA_LOG_FORMAT": "xml"}, "NODEDRA_LOG_FORMAT: 'xml' is not text"),
        ({"NODE_NAME": "n", "NODEDRA_LOG_LEVEL": "loud"}, "NODEDRA_LOG_LEVEL: 'loud'"),
        ({"NODE_NAME": "n", "NODEDRA_WATCH_CLAIMS": "maybe"}, "expected true or false"),
        ({"NODE_NAME": "n", "NODEDRA_CONFIG_POLL": "-1"}, "must be positive"),
        ({"NODE_NAME": "n", "NODEDRA_ORPHAN_GRACE": "soon"}, "NODEDRA_ORPHAN_GRACE: bad value"),
        ({"NODE_NAME": "n", "NODEDRA_METRICS_ADDRESS": "9464"}, "is not host:port"),
        ({"NODE_NAME": "n", "NODEDRA_HEALTH_ADDRESS": "h:99999"}, "is not host:port"),
        ({"NODE_NAME": "n", "NODEDRA_STATUS_ADDRESS": ":x"}, "--status-address / .*:x"),
        ({"NODE_NAME": "n", "NODEDRA_PINNING": "always"}, "NODEDRA_PINNING: 'always' is not one"),
        ({"NODE_NAME": "n", "NODEDRA_NRI_INDEX": "5"}, "NODEDRA_NRI_INDEX: '5' is not two digits"),
    ],
)
def test_bad_settings_name_the_flag(environ: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings(None, environ)
