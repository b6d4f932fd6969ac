"""Ports we hand to servers come from outside the kernel's ephemeral range and Ray's worker ports."""

import socket

import pytest

from orchestrator.cluster import ports


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_free_ports_avoid_the_ephemeral_range_and_ray_worker_ports():
    ephemeral = ports.ephemeral_range()
    picked = [ports.free_port("127.0.0.1") for _ in range(50)]
    assert len(set(picked)) == len(picked), "one process must never be handed the same port twice"
    for port in picked:
        assert port not in ephemeral, f"{port} is in the ephemeral range {ephemeral}"
        assert port not in ports.RAY_WORKER_PORTS
        assert ports.port_free("127.0.0.1", port)


@pytest.mark.skipif(not _has_ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_ipv6_loopback_gets_a_port_too():
    port = ports.free_port("::1")
    assert port in ports.candidate_ports() and ports.port_free("::1", port)


def test_a_port_someone_listens_on_is_not_free():
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports.free_port()))
        s.listen()
        assert not ports.port_free("127.0.0.1", s.getsockname()[1])


def test_no_room_below_the_ephemeral_range_falls_back_to_the_kernel(tmp_path, monkeypatch):
    kernel_range = ports.ephemeral_range()
    narrow = tmp_path / "ip_local_port_range"
    narrow.write_text("20100\t60999\n")  # leaves 100 ports above Ray's worker range: too few to pick from
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE_FILE", narrow)
    assert len(ports.candidate_ports()) == 100
    port = ports.free_port()
    assert port in kernel_range, "with no pool, the port is the kernel's own bind(0) choice"
