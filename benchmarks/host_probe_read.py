"""Read a lease's repeated host probes (host_probe.py JSON files in a .tar.xz) against the registered rules.

probes.tar.xz -> per probe: eager us a launch, graph us a kernel, the Python loop's rate per CPU -> P1-P3, Q-stable,
Q-track of benchmarks/results/2026-11-27-host-probe-predicted/README.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.eager_host_read import spearman

STABLE_MAX, SWINGS_MIN = 1.10, 1.50
TRACKS_MIN, INDEPENDENT_MAX = 0.7, 0.3


def load_probes(archive: Path) -> list[dict]:
    """Every probe-*.json in the archive, in name order (the order they ran)."""
    with tarfile.open(archive) as tar:
        names = sorted(n for n in tar.getnames() if n.rsplit("/", 1)[-1].startswith("probe-") and n.endswith(".json"))
        out = []
        for name in names:
            handle = tar.extractfile(name)
            assert handle is not None, name
            out.append(json.load(handle))
    if not out:
        raise SystemExit(f"{archive}: no probe-*.json inside; give the archive host_probe.py wrote (tar of /tmp/probes)")
    return out


def stable_verdict(spread: float) -> str:
    return "STABLE" if spread <= STABLE_MAX else "SWINGS" if spread >= SWINGS_MIN else "MIXED"


def track_verdict(rho: float | None) -> str:
    if rho is None:
        return "not testable"
    return "TRACKS" if rho >= TRACKS_MIN else "INDEPENDENT" if rho <= INDEPENDENT_MAX else "UNCLEAR"


def report(probes: list[dict]) -> list[str]:
    with_cuda = [p for p in probes if "skipped" not in p["cuda"]]
    if not with_cuda:
        raise SystemExit("no probe ran its CUDA launches (each says why under cuda.skipped)")
    cpu = str(with_cuda[0]["cuda"]["cpu"])
    lines = ["probe  started               eager us  eager p95/p5  graph us  " + "  ".join(
        f"py CPU {c} /s" for c in with_cuda[0]["python"])]
    for i, p in enumerate(with_cuda, 1):
        c = p["cuda"]
        lines.append(f"{i:5d}  {p['started_at']}  {c['eager_us_per_launch']:8.2f}  {c['eager_launches_per_s']['p95_over_p5']:12.2f}"
                     f"  {c['graph_us_per_kernel']:8.2f}  " + "  ".join(f"{s['median']:11.0f}" for s in p["python"].values()))
    eager = [p["cuda"]["eager_us_per_launch"] for p in with_cuda]
    graph = [p["cuda"]["graph_us_per_kernel"] for p in with_cuda]
    loop = [p["python"][cpu]["median"] for p in with_cuda]
    spread = max(eager) / min(eager)
    loop_spread = max(loop) / min(loop)
    rho = spearman(loop, [1 / e for e in eager]) if loop_spread >= STABLE_MAX else None
    lines += [
        f"P1 eager us a launch, median over {len(with_cuda)} probes: {statistics.median(eager):.2f} (registered 3-9)",
        f"P2 graph us a kernel: {statistics.median(graph):.2f} (registered 0.8-3); eager / graph x{statistics.median(eager) / statistics.median(graph):.1f} (registered >= 2)",
        f"P3 Python loop on CPU {cpu}, units/s: median {statistics.median(loop):.0f} (registered 900-1,800)",
        f"Q-stable: eager us max / min over probes x{spread:.3f} -> {stable_verdict(spread)} (<= {STABLE_MAX} STABLE, >= {SWINGS_MIN} SWINGS)",
        f"Q-track: CPU {cpu}'s Python rate max / min x{loop_spread:.2f}; Spearman vs eager launches/s "
        + ("n/a" if rho is None else f"{rho:+.2f}") + f" -> {track_verdict(rho)}",
    ]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("archive", type=Path, help="the call's probes.tar.xz")
    args = parser.parse_args(argv)
    print("\n".join(report(load_probes(args.archive))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
