"""Run one SGLang server with torch.distributed's rendezvous store listening only on the server's address.

SGLang's rank 0 hosts the TCPStore that torch.distributed's rendezvous uses, and torch binds that store on
every interface (`*:port`) whatever host the init method names: on 2xH200 it was the one listener of each
server outside loopback. This wrapper binds the store's socket to `--host` itself, hosts the store on it
(`master_listen_fd`), and lets SGLang join it as a client: torch's agent-store mode
(`TORCHELASTIC_USE_AGENT_STORE=True`) with SGLang's own `SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE`.
The store lives exactly as long as the server: the wrapper waits for it and exits with its status.

Usage: python dist_store.py --host 127.0.0.1 -- python -m sglang.launch_server ...
Run by path with the engine's interpreter, so it imports nothing from this package.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys

PREFIX = "[dist_store]"


def tcp_url(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def host_store(host: str):
    """A TCPStore master listening on `host` only; returns (store, socket, port). The socket is bound before
    torch sees it, so no other process can take the port in between; keep it open as long as the store."""
    from torch.distributed import TCPStore

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    store = TCPStore(host, port, is_master=True, wait_for_workers=False, master_listen_fd=sock.fileno())
    return store, sock, port


def store_env(host: str, port: int) -> dict[str, str]:
    return {"TORCHELASTIC_USE_AGENT_STORE": "True", "SGLANG_DISTRIBUTED_INIT_METHOD_OVERRIDE": tcp_url(host, port)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", required=True, help="address the store listens on (the server's --host)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the server's command line")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the server's command line after --")

    env = dict(os.environ)
    try:
        store, sock, port = host_store(args.host)
        env.update(store_env(args.host, port))
        print(f"{PREFIX} torch.distributed store listening on {tcp_url(args.host, port)} only", flush=True)
    except Exception as exc:  # an older torch without master_listen_fd: the server hosts its own store
        store = sock = None
        print(f"{PREFIX} could not host the store on {args.host} ({exc!r}); the server hosts its own, "
              "which listens on all interfaces", file=sys.stderr, flush=True)

    proc = subprocess.Popen(command, env=env)
    # Stopping is the server's business: pass the signal on and keep the store up until the server has exited.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: proc.send_signal(signum))
    code = proc.wait()
    del store, sock
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
