"""Leftovers of killed runs: find network-namespace labs whose owner process is gone, kill what runs in them, delete them.

`python -m orchestrator.cluster.netns.leftovers list|cleanup` (scripts/netns/lab.sh) does it by hand; the
multi-host tests call cleanup_leftovers() before they build a lab.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from orchestrator.cluster.netns.lab import LIVE_LABS, OWNER_DIR, PREFIX, kill_all, run_ip


def _owner_alive(tag: str) -> bool:
    if tag in LIVE_LABS:
        return True
    try:
        pid = int((OWNER_DIR / tag).read_text())
    except (OSError, ValueError):
        return False
    return pid != os.getpid() and Path(f"/proc/{pid}").exists()


def lab_namespaces() -> dict[str, list[str]]:
    """Every `pdo-<tag>-*` namespace on this machine, by tag."""
    by_tag: dict[str, list[str]] = {}
    done = run_ip("netns", "list", check=False)
    for line in done.stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        parts = name.split("-")
        if name.startswith(PREFIX) and len(parts) >= 3 and parts[1] != "probe":
            by_tag.setdefault(parts[1], []).append(name)
    return by_tag


def cleanup_leftovers() -> list[str]:
    """Delete namespaces of labs whose owner process is gone (and kill what still runs in them)."""
    removed = []
    for tag, names in lab_namespaces().items():
        if _owner_alive(tag):
            continue
        for name in names:
            kill_all(name, grace_s=2.0)
            run_ip("netns", "del", name, check=False)
            removed.append(name)
        (OWNER_DIR / tag).unlink(missing_ok=True)
    return removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.cluster.netns.leftovers", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="namespaces of labs on this machine and whether their owner still runs")
    sub.add_parser("cleanup", help="delete namespaces (and kill processes) of labs whose owner is gone")
    args = parser.parse_args(argv)
    if args.cmd == "list":
        for tag, names in sorted(lab_namespaces().items()):
            state = "owner running" if _owner_alive(tag) else "LEFTOVER"
            print(f"{tag}: {state}: {' '.join(sorted(names))}")
        return 0
    removed = cleanup_leftovers()
    print(f"removed {len(removed)} leftover namespaces" + (f": {' '.join(removed)}" if removed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
