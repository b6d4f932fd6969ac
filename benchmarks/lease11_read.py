"""Lease 11's read (issue 25, hqx2; pre-registered in benchmarks/results/2026-11-27-lease11-predicted/): the two-H100
Qwen3 pair's closed-loop rows, the transfer line with a GPU per role, and the Qwen3-shaped layer-count probe.

    .venv/bin/python benchmarks/lease11_read.py benchmarks/results/2026-11-27-lease11-h100x2

1. The rows: AIPerf's goodput.json per N (serve archive), the prepared start (serve's `ready: OpenAI gateway ... after`
   line) and the cold start (prepare's `ready after ... (caches were cold)` lines), as closed_loop.yaml's `measured`.
2. The transfer line per N (closed_loop_waves.py part 6's reader on the serve archive's engine logs): the transfer
   worker's queue p50 and NIXL p50, the CV of each stage's events per 0.5 s, and the registered outcome at each N.
3. The layer probe: layers.tar's raw files through benchmarks/qwen3_layer_count.py read.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import qwen3_layer_count  # noqa: E402
from benchmarks.closed_loop_waves import bin_terms, measured_stages  # noqa: E402

GATEWAY_READY = re.compile(r"ready: OpenAI gateway \S+ \(model [^)]*\) after ([\d.]+) s")
COLD_READY = re.compile(r"ready after ([\d.]+) s \(caches were cold\)")
CV_RISE = 0.10  # registered: CV(KV landed) - CV(KV enqueued) at or above this, with queue p50 > NIXL p50: the line queues


def archive_text(archive: Path, suffix: str) -> str:
    """The one member of `archive` whose name ends with `suffix`."""
    with tarfile.open(archive) as tar:
        found = [m for m in tar.getmembers() if m.name.endswith(suffix)]
        if len(found) != 1:
            raise SystemExit(f"{archive}: expected one member ending {suffix!r}, found {len(found)}")
        stream = tar.extractfile(found[0])
        assert stream is not None
        return io.TextIOWrapper(stream, encoding="utf-8").read()


def find(folder: Path, name: str) -> Path:
    """`name` in the folder or one of its call folders (callN-*/), else the path it would have at the top."""
    if (folder / name).is_file():
        return folder / name
    return next(iter(sorted(folder.glob(f"*/{name}"))), folder / name)


def rows(folder: Path) -> dict[int, dict[str, float]]:
    """N -> closed_loop.yaml's `measured` for that N."""
    serve, prepare = find(folder, "serve.tar.xz"), find(folder, "prepare.tar.xz")
    goodput = json.loads(archive_text(serve, "goodput-ours/goodput.json"))
    ready = GATEWAY_READY.search(archive_text(serve, "serve/serve.txt"))
    cold = [float(x) for x in COLD_READY.findall(archive_text(prepare, "prepare/prepare.txt"))] if prepare.is_file() else []
    out = {}
    for row in goodput["rows"]:
        measured = {"output_tok_s": round(row["output_tok_s"], 2), "good_fraction": round(row["good_fraction"], 4),
                    "ttft_p50_ms": round(row["ttft_ms"]["p50"], 2), "itl_p50_ms": round(row["itl_ms"]["p50"], 3)}
        if ready:
            measured["ready_s"] = float(ready.group(1))
        if cold:
            measured["ready_cold_s"] = max(cold)
        out[int(row["concurrency"])] = measured
    return out


def transfer_line(folder: Path, ns: list[int]) -> None:
    print("\n2. The transfer line with a GPU per role: CV of each stage's events per 0.5 s over the window "
          "(~0: paced; higher: in waves), the transfer worker's queue and NIXL p50")
    for n in ns:
        try:
            stages = measured_stages(find(folder, "serve.tar.xz"), n)
        except (SystemExit, ValueError, KeyError) as exc:
            print(f"  N = {n}: not read ({exc})")
            continue
        (queue, nixl), (busy, pops) = stages["_worker"], stages["_busy"]
        print(f"  N = {n}: " + "  ".join(f"{k} {bin_terms(v).strip()}" for k, v in stages.items() if not k.startswith("_")))
        cv = {k: float(bin_terms(stages[k])) for k in ("KV enqueued", "KV landed")}
        rise = cv["KV landed"] - cv["KV enqueued"]
        if queue > nixl and rise >= CV_RISE:
            outcome = "the line queues and re-forms the wave"
        elif queue <= nixl and rise < CV_RISE:
            outcome = "the line does not queue a wave"
        else:
            outcome = "mixed"
        print(f"    queue p50 {queue * 1e3:.1f} ms, NIXL p50 {nixl * 1e3:.1f} ms; CV KV enqueued -> landed "
              f"{cv['KV enqueued']:.2f} -> {cv['KV landed']:.2f} ({rise:+.2f}); the prefill computes {busy:.0%} of the "
              f"window, {pops:.0%} of the pops inside a forward; registered outcome: {outcome}")


def layers(folder: Path) -> int:
    tar_path = find(folder, "layers.tar")
    if not tar_path.is_file():
        print("\n3. The layer probe: no layers.tar")
        return 1
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(tar_path) as tar:
        tar.extractall(tmp, filter="data")
        raws = sorted(Path(tmp).glob("gpu*/calibration-q3l*-lease11.json"))
        print(f"\n3. The layer probe: {', '.join(p.name for p in raws) or 'no raw file'}")
        return qwen3_layer_count.read(raws) if raws else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="the lease's results folder (serve.tar.xz, prepare.tar.xz, layers.tar)")
    args = parser.parse_args(argv)
    measured = rows(args.folder)
    print("1. The rows (closed_loop.yaml `measured`)")
    for n, m in sorted(measured.items()):
        print(f"  N = {n}: {json.dumps(m)}")
    transfer_line(args.folder, sorted(measured))
    return layers(args.folder)


if __name__ == "__main__":
    sys.exit(main())
