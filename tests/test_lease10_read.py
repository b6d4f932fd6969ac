"""benchmarks/lease10_read.py on small archives built here: it reads each round's steps, splits them fast / slow at
the pre-registered 80 / 88 ms, and names the outcome whose signature the slow steps carry."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from benchmarks.lease10_read import listen_counters, main


def _archive(d: Path, slow: dict, fast: dict, n: int = 60, slow_every: int = 3) -> Path:
    """One base round of n decode steps at 600 running; every slow_every-th iteration slow with `slow`'s fields."""
    t, lines = 1000.0, []
    for i in range(1, n + 2):
        kind = slow if i % slow_every == 0 else fast
        prev_len = lines[-1]["_len"] if lines else None
        line = {"i": i, "m": "d", "bs": 600, "t0": round(t, 4), "c0": kind["cpu_no"], "c1": kind["cpu_no"], "anc": 0,
                "wall": kind["wall"], "cpu": kind["cpu"], "gpu": kind["gpu"], "g0": 0.1, "g1": kind["g1"],
                "_len": kind["L"]}
        if prev_len is not None:
            prev = slow if (i - 1) % slow_every == 0 else fast
            line.update({"per": prev_len, "it_cpu": prev["cpu"] + 2, "run": prev["cpu"] + 2, "rq": prev["rq"], "sl": 3,
                         "gc": [1, 0, 0, 0.1, 0.0, 0.0], "mem": [0, 0, 0]})
        lines.append(line)
        t += kind["L"] / 1e3
    events = [{"t": 999.9, "event": "round 0 base begins: 600 x 1024 out"}, {"t": t + 1, "event": "round 0 base ends (exit 0)"}]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name, text in (("steps.jsonl", "\n".join(json.dumps({k: v for k, v in x.items() if k != "_len"})
                                                      for x in lines)),
                           ("events.jsonl", "\n".join(json.dumps(e) for e in events))):
            data = text.encode()
            info = tarfile.TarInfo(f"lone10/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (d / "lone10.tar.xz").write_bytes(buf.getvalue())
    (d / "host.txt").write_text("node 0 cpus: 0 1 2 3\nnode 1 cpus: 4 5 6 7\n")
    return d


FAST = {"L": 65.0, "wall": 60.0, "cpu": 59.0, "gpu": 59.0, "g1": 0.5, "rq": 0.1, "cpu_no": 3}


@pytest.mark.parametrize("slow, named", [
    ({**FAST, "L": 105.0, "wall": 100.0, "cpu": 99.0, "gpu": 120.0, "g1": 25.0}, "G-work"),
    ({**FAST, "L": 105.0, "wall": 100.0, "cpu": 60.0, "rq": 40.0}, "C-rq"),
    ({**FAST, "L": 105.0, "wall": 100.0, "cpu": 99.0, "gpu": 99.0, "cpu_no": 6}, "C-mig"),
    ({**FAST, "L": 105.0, "wall": 100.0, "cpu": 99.0, "gpu": 99.0}, "C-core"),
])
def test_the_slow_steps_signature_names_the_outcome(tmp_path, capsys, slow, named) -> None:
    out = tmp_path / "read.json"
    assert main([str(_archive(tmp_path, slow, FAST)), "--json", str(out)]) == 0
    read = json.loads(out.read_text())
    assert read["outcome"].startswith(named), read["outcome"]
    base = read["rounds"][0]
    assert base["slow"]["n"] > 10 and base["fast"]["n"] > 20 and 0.25 < base["slow_share"] < 0.4


def test_no_slow_steps_is_no_slow_mode(tmp_path) -> None:
    out = tmp_path / "read.json"
    main([str(_archive(tmp_path, FAST, FAST)), "--json", str(out)])
    assert json.loads(out.read_text())["outcome"].startswith("N")


def test_a_folder_without_the_archive_is_refused_with_the_folder_named(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        main([str(tmp_path)])
    assert "lone10.tar.xz not found" in capsys.readouterr().err


def test_listen_counters_come_from_nstat_or_proc_net_netstat() -> None:
    assert listen_counters("TcpExtListenOverflows           3                  0.0\n") == {"ListenOverflows": 3}
    netstat = "TcpExt: SyncookiesSent ListenOverflows ListenDrops\nTcpExt: 0 5 7\nIpExt: InNoRoutes\nIpExt: 0\n"
    assert listen_counters(netstat) == {"ListenOverflows": 5, "ListenDrops": 7}
