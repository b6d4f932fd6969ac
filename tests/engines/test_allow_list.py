"""engine.allow_from: the kernel drops connections from hosts off the list (a BPF filter on the listening socket),
loopback always gets in, `cluster` becomes the Ray nodes' addresses, and bad entries are one line naming the field.
Across real hosts (a client namespace outside the cluster): tests/multihost/test_hosts_serve.py."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from orchestrator.config import ConfigError
from orchestrator.engines.allow_list import LOOPBACK, listening_socket, resolve
from tests.support import sim_config


def connects(networks: list[ipaddress.IPv4Network]) -> bool:
    server = listening_socket("127.0.0.1", 0, networks)
    server.listen(8)
    try:
        socket.create_connection(server.getsockname(), 0.5).close()
        return True
    except OSError:
        return False
    finally:
        server.close()


def test_a_host_off_the_list_gets_no_answer_and_a_listed_one_connects() -> None:
    assert not connects([ipaddress.IPv4Network("10.0.0.0/8")])  # loopback is not on this raw list: its SYN dropped
    assert connects([ipaddress.IPv4Network("10.0.0.0/8"), ipaddress.IPv4Network("127.0.0.1/32")])
    assert connects(resolve(["192.0.2.7"], []))  # resolve() always lets the engine's own host in


def test_cluster_becomes_every_node_address_plus_loopback() -> None:
    nets = resolve(["cluster", "10.1.0.0/24", "198.18.0.2"], ["198.18.0.1", "198.18.0.2"])
    assert nets == [LOOPBACK, ipaddress.IPv4Network("198.18.0.1/32"), ipaddress.IPv4Network("198.18.0.2/32"),
                    ipaddress.IPv4Network("10.1.0.0/24")]


@pytest.mark.parametrize("overrides, message", [
    ({"engine.allow_from": ["cluster", "10.1.0.300"]}, "allow_from: '10.1.0.300' is not an IPv4 address"),
    ({"engine.allow_from": ["cluster"], "engine.kind": "sglang"}, "enforced by the simulated engine only"),
])
def test_an_allow_list_that_cannot_be_enforced_is_one_line_naming_the_field(overrides, message) -> None:
    with pytest.raises(ConfigError) as refused:
        sim_config(overrides)
    text = str(refused.value)
    assert "engine" in text and message in text and "\n" not in text.split(" (got ")[0], text
