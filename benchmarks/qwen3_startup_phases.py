"""The Qwen3-shaped pair's start-ups phase by phase from the engine logs, beside the planner's start-up phases (issue 25).

    .venv/bin/python benchmarks/qwen3_startup_phases.py

Reads the six start-ups of models/qwen3-235b-a22b-fp8-l6 on record (one H100 shared by both servers: `prepare` calls 8
and 14 = cold compile caches, `serve` calls 9 and 15 = prepared; two H200s, a GPU per server: `prepare` call 3, `serve`
call 4): each archive's SGLang logs (timestamped lines: first line, server args, torch.distributed init, weights, KV
pool, decode CUDA-graph capture with its progress bar, engine start-up timings, "fired up") and our own ready figure
from the call's main log (`prepare`: "ready after N s", `serve`: "workers ready in N s"). Per start-up, seconds:

  outside   our ready minus SGLang's own span (its first log line .. the last server's "fired up"): starting the
            local Ray cluster, Serve and the placement groups, spawning SGLang and importing it up to its first log
            line, and our health poll after "fired up"
  args      first line .. "Init torch distributed begin" (server args, tokenizer manager, the scheduler's spawn)
  load      init .. graph capture begin (weights, KV pool, ...)
  graphs    decode CUDA-graph capture; `first` = its first (largest) batch size, `rest` = the other sizes
  to-fired  graphs end .. the decode's "fired up" (its warm-up request)
  prefill-1 the prefill server's "Engine startup timings" .. its "fired up": its warm-up request, its first forward

Second table: placement incl. the local cluster's start ("Phase placement" of every `bench` through the product's
local cluster on a lent GPU machine, other runs than the six above) against placement on a cluster already up
(hand-started raylets), the figure behind the planner's 15 s. Third: the first graph size's capture in the cold
starts of the profiles the planner lends these configs their start-up from. Fourth: the planner's start-up phases for the two
configs (the model as it stands; cold as `prepare` times it, from a cluster already up).
"""

from __future__ import annotations

import io
import re
import statistics
import sys
import tarfile
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.config import load_config  # noqa: E402
from orchestrator.perfmodel.costmodel import cost_model_for  # noqa: E402
from orchestrator.plan.deadline import cluster_start_s, placement_s  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
H100 = "2026-11-26-qwen3-serve-one-h100"
H200 = "2026-11-26-two-gpu-lease2-h200x2"
# (label, archive, main log, caches)
STARTUPS = [
    ("H100 x1 shared, prepare call 8", f"{H100}/prepare-call8.tar.xz", f"{H100}/main-prepare-call8.log", "cold"),
    ("H100 x1 shared, prepare call 14", f"{H100}/prepare-call14.tar.xz", f"{H100}/main-prepare-call14.log", "cold"),
    ("H100 x1 shared, serve call 9", f"{H100}/serve-call9.tar.xz", f"{H100}/main-serve-call9.log", "warm"),
    ("H100 x1 shared, serve call 15", f"{H100}/serve-call15.tar.xz", f"{H100}/main-serve-call15.log", "warm"),
    ("H200 x2, prepare call 3", f"{H200}/call3-pd-cold-prepare/prepare.tar.xz", f"{H200}/call3-pd-cold-prepare/main-prepare.log", "cold"),
    ("H200 x2, serve call 4", f"{H200}/call4-pd-serve/serve.tar.xz", f"{H200}/call4-pd-serve/main-serve.log", "warm"),
]
CONFIGS = {"H100 x1 shared": ("configs/device-h100x1-qwen3-serve.yaml", "H100-SXM"),
           "H200 x2": ("configs/device-h200x2-qwen3-serve.yaml", "H200")}
# every `bench` through the product's local cluster (cluster.address: local) on a lent GPU machine, and the two on a
# cluster already up; none of them is one of the six start-ups above
LOCAL_CLUSTER_LOGS = [
    "device-h200x2-local-cluster-2026-11-21/first-run-main.log", "device-h200x2-local-cluster-2026-11-21/local2-main.log",
    "device-h200x2-local-cluster-2026-11-21/page64-main.log", "device-h200x2-local-cluster-2026-11-21/ucx-lo-main.log",
    "device-h200x2-dist-store-2026-11-22/local2-main.log", "2026-11-26-two-gpu-h200x2/call2-pd-agg/main-pd-agg.log",
    "2026-11-26-two-gpu-h200x2/call5-pd/main-pd-retry.log", "2026-11-26-sglang-one-h100/main-agg-router-call9.log",
    "2026-11-26-sglang-one-h100/main-pd-early-call8.log", "2026-11-26-sglang-one-h100/main-pd-call5-failed-httptools.log",
    "2026-11-26-sglang-one-h100/main-pd-nooverlap-call7.log", "2026-11-26-sglang-one-h100/main-agg-call11.log",
]
SAME_MACHINE_LOGS = [  # the H200 x2 Qwen3 runs' own lease (same machine, other runs): shown, not in the median
    f"{H200}/call3-pd-cold-prepare/main-pd.log", f"{H200}/call4-pd-serve/main-pd-warm.log",
]
# the cold starts of the two start-up lenders (perfmodel/profiles: startup[].first_graph_capture_s is read from these)
LENDER_COLD_LOGS = [
    ("h200-deepseek-v2-lite-bf16-sglang0.5.17-pd-logs", "device-h200x2-2026-11-21/raw.tar.xz", "c2/call1/agg0.log"),
    ("h100-sxm-r1s6-sglang0.5.17", "2026-11-24-calibration-h100-r1shaped/logs-r1.tar.xz", "r1/server-r1s6-cold-default.log"),
]
RUNNING_CLUSTER_LOGS = ["device-h200x2-2026-11-21/call3a-main.log", "device-h200x2-2026-11-21/call3c-main.log"]

STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] (.*)$")
# tqdm's rate after the first of N sizes: that size's capture seconds
FIRST_SIZE = re.compile(r"Capturing batches \(bs=\d+[^|]*\|[^|]*\|\s+1/(\d+) \[[\d:]+<[^,]*,\s+([\d.]+)(s/it|it/s)\]")
PLACEMENT = re.compile(r"Phase placement \(s\):\s+([\d.]+)")
MARKS = {"args": "server_args=", "init": "Init torch distributed begin", "graphs_begin": "CUDA graph begin",
         "graphs_end": "CUDA graph end", "timings": "Engine startup timings", "fired": "fired up and ready"}


def engine_logs(archive: Path) -> dict[str, str]:
    """role (prefill | decode) -> the SGLang log text in `archive`."""
    out = {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            name = Path(member.name).name
            stream = tar.extractfile(member)
            if stream is not None and name in ("prefill-0-0.log", "decode-0-0.log"):
                out[name.split("-")[0]] = io.TextIOWrapper(stream, encoding="utf-8", errors="replace").read()
    return out


def marks(text: str) -> dict[str, float]:
    """Epoch seconds of each phase's log line (first occurrence), and the first graph size's capture seconds."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = STAMP.match(line)
        if not m:
            continue
        t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
        out.setdefault("first", t)
        for key, needle in MARKS.items():
            if needle in m.group(2):
                out.setdefault(key, t)
    first = first_size(text)
    if first:
        out["sizes"], out["first_size_s"] = first
    return out


def first_size(text: str) -> tuple[int, float] | None:
    """(batch sizes captured, seconds the first of them took) from SGLang's capture progress bar."""
    m = FIRST_SIZE.search(text.replace("\r", "\n"))
    if not m:
        return None
    rate = float(m.group(2))
    return int(m.group(1)), rate if m.group(3) == "s/it" else 1 / rate


def our_ready_s(main_log: str) -> float:
    m = re.search(r"ready after (\d+) s \(caches were|workers ready in ([\d.]+) s", main_log)
    if not m:
        raise SystemExit("no ready figure in the main log")
    return float(m.group(1) or m.group(2))


def startup_row(label: str, archive: str, main_log: str, caches: str) -> dict:
    logs = {role: marks(text) for role, text in engine_logs(RESULTS / archive).items()}
    d, p = logs["decode"], logs["prefill"]
    ready = our_ready_s((RESULTS / main_log).read_text())
    span = max(d["fired"], p["fired"]) - min(d["first"], p["first"])
    graphs = d["graphs_end"] - d["graphs_begin"]
    return {"label": label, "caches": caches, "ready": ready, "outside": ready - span, "span": span,
            "args": d["init"] - d["first"], "load": d["graphs_begin"] - d["init"], "graphs": graphs,
            "first": d.get("first_size_s", float("nan")), "sizes": d.get("sizes", 0),
            "to_fired": d["fired"] - d["graphs_end"], "prefill_first": p["fired"] - p["timings"]}


def placements(paths: list[str]) -> list[tuple[str, float]]:
    out = []
    for rel in paths:
        out += [(rel, float(s)) for s in PLACEMENT.findall((RESULTS / rel).read_text())]  # one per bench in the call
    return out


def model_rows() -> list[tuple[str, str, dict[str, float]]]:
    out = []
    for where, (path, gpu) in CONFIGS.items():
        cfg = load_config(ROOT / path, paths_from=ROOT)
        for caches in ("warm", "cold"):
            parts_by_group = []
            for role, _, group in cfg.layout.groups():
                parts = cost_model_for(cfg, role, group, gpu=gpu).startup_breakdown_s("dummy", 2.0, caches == "warm")
                parts_by_group.append(parts)
            slowest = max(parts_by_group, key=lambda parts: sum(parts.values()))
            # `prepare` (cold) times its compile step after its node checks started the local cluster
            placement = placement_s(cfg) - (cluster_start_s(cfg) if caches == "cold" else 0.0)
            out.append((where, caches, {"placement": placement, **slowest}))
    return out


def main() -> int:
    rows = [startup_row(*s) for s in STARTUPS]
    print("Start-ups of the Qwen3-shaped pair (6 layers, FP8 block, dummy weights), seconds, from the engine logs:")
    print(f"{'start-up':<34} {'caches':<6} {'ready':>6} {'outside':>8} {'args':>5} {'load':>5} {'graphs':>7} "
          f"{'first':>6} {'rest':>5} {'to-fired':>8} {'prefill-1':>9}")
    for r in rows:
        print(f"{r['label']:<34} {r['caches']:<6} {r['ready']:>6.1f} {r['outside']:>8.1f} {r['args']:>5.0f} "
              f"{r['load']:>5.0f} {r['graphs']:>7.0f} {r['first']:>6.1f} {r['graphs'] - r['first']:>5.0f} "
              f"{r['to_fired']:>8.0f} {r['prefill_first']:>9.0f}")
    print("(first: the capture of the first of", rows[0]["sizes"], "batch sizes, from SGLang's progress bar; "
          "log stamps are whole seconds)")

    local, same, running = placements(LOCAL_CLUSTER_LOGS), placements(SAME_MACHINE_LOGS), placements(RUNNING_CLUSTER_LOGS)
    print("\nPlacement phase of `bench` runs on lent GPU machines (other runs), seconds:")
    for rel, s in local:
        print(f"  local cluster started by the run  {s:6.2f}  {rel}")
    for rel, s in same:
        print(f"  same, the H200 x2 lease's own     {s:6.2f}  {rel}  (not in the median)")
    for rel, s in running:
        print(f"  cluster already up                {s:6.2f}  {rel}")
    print(f"local cluster: median {statistics.median(s for _, s in local):.1f} s over {len(local)} runs "
          f"({min(s for _, s in local):.1f}-{max(s for _, s in local):.1f}); cluster already up: "
          f"{', '.join(f'{s:.1f}' for _, s in running)} s")

    print("\nCold graph capture of the start-up lenders' own cold starts (the first size compiles what the rest reuse):")
    for profile, archive, member in LENDER_COLD_LOGS:
        with tarfile.open(RESULTS / archive) as tar:
            stream = tar.extractfile(member)
            assert stream is not None
            text = stream.read().decode("utf-8", errors="replace")
        sizes, first = first_size(text) or (0, float("nan"))
        end = re.search(r"CUDA graph end\. elapsed=([\d.]+) s", text)
        total = float(end.group(1)) if end else float("nan")
        print(f"  {profile:<50} first of {sizes} sizes {first:6.2f} s, all {total:6.2f} s  ({archive} {member})")

    print("\nThe planner's start-up phases (slowest server), seconds:")
    for where, caches, parts in model_rows():
        total = sum(parts.values())
        print(f"  {where:<15} {caches:<5} ready {total:6.1f} = " + " + ".join(f"{k} {v:.1f}" for k, v in parts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
