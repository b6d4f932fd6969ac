"""Lease 4 (issue 25, hgpu3): the engine logs' decode lines of the same-host A/Bs, read term by term (no model, no fit).

For each bench run of benchmarks/results/2026-11-26-two-gpu-lease4-h100x2/ (aggregated TP 2 with graphs to 256 / to
1024; PD decode mem 0.65 / 0.55) it prints every `Decode batch` line of the run's own engine log (rank 0): seconds from
the first line, running requests, graph or eager, gen tok/s and the step it implies (running / gen tok/s; the first
line's interval also holds prefill), then the eager stretch (from the line before the first one above the largest
graph to the line after the last one) and the peak running batch and retractions (a PD decode logs them per line).

Usage (repo root): .venv/bin/python benchmarks/lease4_decode_logs.py
"""

from __future__ import annotations

import re
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.calibrate.logparse import decode_lines  # noqa: E402

LEASE4 = ROOT / "benchmarks/results/2026-11-26-two-gpu-lease4-h100x2"
RUNS = [  # (label, tarball, the deployment's log)
    ("aggregated TP 2, graphs to 256", "call3-agg-ab/agg-tp2-graphs256.tar.xz", "aggregated-0-0.log"),
    ("aggregated TP 2, graphs to 1024", "call4-agg-graphs1024-retry/agg-tp2.tar.xz", "aggregated-0-0.log"),
    ("PD decode, mem 0.65", "call5-pd-ab/pd-mem065.tar.xz", "decode-0-0.log"),
    ("PD decode, mem 0.55", "call5-pd-ab/pd-mem055.tar.xz", "decode-0-0.log"),
]
_POOL = re.compile(r"max_total_num_tokens=(\d+)")
_GRAPHS = re.compile(r"cuda_graph_max_bs_decode=(\d+)")


def run_log(tarball: Path, log_name: str) -> str:
    """The engine log of the bench run the tarball holds (its scrape folder also keeps earlier runs' logs)."""
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
        run_id = next(n.split("/")[2] for n in names if n.split("/")[1:2] == ["runs"] and n.count("/") >= 2)
        member = next(n for n in names if n.endswith(f"scrape/{run_id}/{log_name}"))
        data = tar.extractfile(member)
        assert data is not None, member
        return data.read().decode(errors="replace")


def report(label: str, text: str) -> list[str]:
    rows = [r for r in decode_lines(text) if r["ranks"] in ("", "TP0")]   # rank 0 speaks for a TP server
    graphs_m, pool_m = _GRAPHS.search(text), _POOL.search(text)
    assert graphs_m and pool_m, "no server_args / max_total_num_tokens line in the log"
    graphs = int(graphs_m.group(1))
    t0 = rows[0]["t"]
    out = [f"== {label} (decode graphs to {graphs}; KV pool {int(pool_m.group(1)):,} tokens)",
           "     s  running  graph   gen tok/s  step ms" + ("  prealloc transfer retracted" if "prealloc" in rows[0] else "")]
    for r in rows:
        step = 1e3 * r["running"] / r["gen_tok_s"] if r["gen_tok_s"] > 0 else float("nan")
        pd = f"  {r['prealloc']:8d} {r['transfer']:8d} {r['retracted']:9d}" if "prealloc" in r else ""
        out.append(f"  {r['t'] - t0:4.0f}  {r['running']:7d}  {'yes' if r['cuda_graph'] else 'eager':>5}  "
                   f"{r['gen_tok_s']:10.1f}  {step:7.1f}{pd}")
    big = [i for i, r in enumerate(rows) if r["running"] > graphs]
    if big:   # from the line before the first eager one (its interval ran eager steps) to the line after the last
        start, end = rows[max(big[0] - 1, 0)]["t"], rows[min(big[-1] + 1, len(rows) - 1)]["t"]
        out.append(f"  eager stretch: {len(big)} lines above {graphs} running, {end - start:.0f} s "
                   f"(s {start - t0:.0f} -> {end - t0:.0f})")
    else:
        out.append(f"  every line at or under {graphs} running: no eager stretch")
    out.append(f"  peak running {max(r['running'] for r in rows)}; retracted "
               f"{max((r.get('retracted', 0) for r in rows), default=0)} at most; {len(rows)} lines")
    return out


def main() -> None:
    lines = []
    for label, tarball, log_name in RUNS:
        lines += report(label, run_log(LEASE4 / tarball, log_name)) + [""]
    print("\n".join(lines).rstrip())


if __name__ == "__main__":
    main()
