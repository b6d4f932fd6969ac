"""The dist_store wrapper keeps torch.distributed's rendezvous store on the server's address.

The "server" here is a stand-in that does what SGLang's rank 0 does at start-up: init_process_group on
the init method SGLang would use, plus a gloo group, then reports every socket its process tree listens on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cluster.ports import free_port
from orchestrator.engines.sglang import dist_store

pytest.importorskip("torch.distributed")
REPO = Path(__file__).resolve().parents[2]
WRAPPER = Path(dist_store.__file__)

# init_method: SGLang's override when the wrapper set one, else SGLang's default tcp://<host>:<nccl_port>
FAKE_RANK0 = r"""
import json, os, sys
import torch.distributed as dist
from orchestrator.cluster.listening import listening_sockets
init = os.environ.get("SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE") or sys.argv[1]
dist.init_process_group("gloo", init_method=init, world_size=1, rank=0)
dist.barrier(group=dist.new_group([0], backend="gloo"))
found = listening_sockets([os.getppid(), os.getpid()])
print(json.dumps({"init": init, "listening": [[s.host, s.port, s.loopback_only] for s in found]}))
"""


def _run(argv: list[str]) -> dict:
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_without_the_wrapper_torch_listens_on_every_interface():
    """The control: this is what SGLang does by itself, and what the census must be able to see."""
    report = _run([sys.executable, "-c", FAKE_RANK0, f"tcp://127.0.0.1:{free_port()}"])
    exposed = [s for s in report["listening"] if not s[2]]
    assert exposed, f"torch's own store should listen beyond loopback: {report}"


@pytest.mark.slow
def test_with_the_wrapper_every_listener_is_on_loopback():
    report = _run([sys.executable, str(WRAPPER), "--host", "127.0.0.1", "--",
                   sys.executable, "-c", FAKE_RANK0, "tcp://127.0.0.1:1"])  # the fallback must not be used
    assert report["init"].startswith("tcp://127.0.0.1:")
    store_port = int(report["init"].rsplit(":", 1)[1])
    assert [store_port, True] in [s[1:] for s in report["listening"]], "the store is the wrapper's, on loopback"
    assert all(s[2] for s in report["listening"]), report


@pytest.mark.slow
def test_the_wrapper_exits_with_the_servers_status_and_goes_down_with_its_group():
    failing = subprocess.run([sys.executable, str(WRAPPER), "--host", "127.0.0.1", "--",
                              sys.executable, "-c", "import sys; sys.exit(3)"], timeout=60)
    assert failing.returncode == 3

    # the way EngineProcess stops an engine: SIGTERM to the whole process group
    server = "import signal, sys, time; print('up', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, str(WRAPPER), "--host", "127.0.0.1", "--", sys.executable, "-c", server],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    lines = iter(proc.stdout.readline, "")
    assert any(line.strip() == "up" for line in lines)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM


def test_tcp_url_brackets_ipv6_hosts():
    assert dist_store.tcp_url("10.0.0.5", 29500) == "tcp://10.0.0.5:29500"
    assert dist_store.tcp_url("fd00::5", 29500) == "tcp://[fd00::5]:29500"
