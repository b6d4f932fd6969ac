"""A two-GPU calibration run (`calibrate twogpu`, calibrate/twogpu.py) against the cost model of the same servers and
messages: the cost model of each server a run ran (server_model), the planner's prefill of k prompts sent at once
(chunked_prefill_s: the step loop's own burst), and the comparison tables benchmarks/two_gpu_vs_model.py prints: NCCL
all-reduce / all-to-all / send times against collectives.py's published figures, each layout's decode steps (TP2, DP-attention 2 + EP2, PP2,
eager TP2) against the model's step at that batch and context, and prefill latencies against the model's chunking.

calibration-twogpu*.json (+ collectives.json) -> server_model / chunked_prefill_s -> vs_model_report lines
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator.compressed import read_text
from orchestrator.config.model_presets import DEEPSEEK_R1
from orchestrator.perfmodel.costmodel import EngineCostModel, build_cost_model
from orchestrator.perfmodel.from_raw import gpu_key
from orchestrator.perfmodel.gpus import gpu_spec
from orchestrator.perfmodel.parallel import collectives
from orchestrator.perfmodel.scheduling.limits import server_limits
from orchestrator.perfmodel.scheduling.steps import burst_prefill

# the cost-model fields of each server layout calibrate/twogpu.py runs (its LAYOUTS: the same names)
LAYOUT_FIELDS: dict[str, dict[str, Any]] = {
    "tp2": dict(tp=2),
    "dpattn2-ep2": dict(tp=2, dp=2, dp_attention=True, ep=2),
    "pp2": dict(tp=1, pp=2),
    "tp2-eager": dict(tp=2, cuda_graph=False),  # --disable-cuda-graph: every decode step eager
    "pp2-tail": dict(tp=1, pp=2),
}


def _find(root: Path, name: str) -> list[Path]:
    """Files named `name` under root, also where they are committed xz-compressed (NAME.xz)."""
    return sorted([*root.rglob(name), *root.rglob(f"{name}.xz")])


def collectives_table(path: Path, gpu: str) -> list[str]:
    """collectives.json's NCCL times next to collectives.py's, message by message."""
    data = json.loads(read_text(path))
    links = collectives.link_figures(gpu_spec(gpu))
    lines = [f"collectives ({path}): {data['info'].get('device')}, NCCL {data['info'].get('nccl')}, "
             f"{data['info'].get('world')} ranks; measured us / model us (error)"]
    for row in data["rows"]:
        nbytes = row["bytes"]
        cells = []
        for key, model_s in (("allreduce_us", collectives.allreduce_s(nbytes, 2, 1, links)),
                             ("alltoall_us", collectives.alltoall_s(nbytes, 2, 1, links)),
                             ("send_us", collectives.p2p_send_s(nbytes, False, links))):
            seen = row.get(key)
            cells.append(f"{key[:-3]} {seen:9.1f} / {model_s * 1e6:8.1f} ({model_s * 1e6 / seen - 1:+6.0%})"
                         if seen else f"{key[:-3]} -")
        lines.append(f"  {row['tokens']:5d} tokens {nbytes / 1e6:7.2f} MB  " + "  ".join(cells))
    return lines


def server_model(run: dict, gpu: str, layers: int) -> EngineCostModel:
    """The cost model of the server one run of a two-GPU calibration file ran: R1's layer shape at the file's layer
    count, its layout, and the settings its server reported (`derived`)."""
    d = run.get("derived") or {}
    shape = replace(DEEPSEEK_R1, num_hidden_layers=layers, first_k_dense_replace=min(3, layers // 2))
    return build_cost_model(
        shape, gpu, "fp8", attention_backend=d.get("attention_backend") or "triton", load_format="dummy",
        mem_fraction_static=d.get("mem_fraction_static") or 0.7, cuda_graph_max_bs=d.get("cuda_graph_decode_max_bs"),
        context_length=d.get("context_length") or 16384,
        # the flag: SGLang logs each DP-attention rank's share of it (server_args.py divides it by the DP size)
        chunked_prefill_tokens=(d.get("chunked_prefill_size") or 8192) * (d.get("dp_size") or 1 if d.get("enable_dp_attention") else 1),
        **LAYOUT_FIELDS[run["variant"]],
    )


def chunked_prefill_s(model: EngineCostModel, k: int, length: int) -> float:
    """k prompts of `length` tokens sent at once to an idle server, through the planner's own step loop
    (scheduling/steps.py burst_prefill: its chunking, per DP-attention rank its share, the first request alone, the
    idle launch)."""
    return sum(f.duration_s for f in burst_prefill(server_limits(model), model, [length] * k))


def layout_tables(path: Path) -> list[str]:
    """Each layout run of a calibration-twogpu*.json: its decode steps and prefill latencies next to the model's."""
    raw = json.loads(read_text(path))
    gpu = gpu_key(raw["gpu"]["name"])
    layers = int(raw["model"]["config"]["num_hidden_layers"])
    lines = [f"\nlayouts ({path}): {raw['gpu']['name']}, R1 layer shape x {layers} layers"]
    for run in raw.get("runs", []):
        if run.get("variant") not in LAYOUT_FIELDS:
            continue
        if not run.get("derived"):
            lines.append(f"  {run['variant']}: no server info (start failed or skipped: {run.get('error') or run.get('skipped')})")
            continue
        model = server_model(run, gpu, layers)
        lines.append(f"  {run['variant']} (tp {model.tp}, pp {model.pp}, dp {model.dp}"
                     f"{', DP attention' if model.dp_attention else ''}, ep {model.ep}): decode step measured / model")
        for key in ("decode", "context"):
            for row in run.get(key) or []:
                if not row.get("step_ms_median"):
                    continue
                bs = int(row.get("running_batch") or row["batch_size"])
                ctx = int(row.get("kv_tokens_median") or bs * (row["context_tokens"] + 50))
                predicted = model.decode_step_s(bs, ctx) * 1e3
                client = row.get("client") or {}
                wall = client.get("wall_s")
                lines.append(f"    B={bs:4d} C={row['context_tokens']:6d}: {row['step_ms_median']:7.2f} ms / {predicted:7.2f} ms "
                             f"({predicted / row['step_ms_median'] - 1:+6.1%})" + (f"  wall {wall:.2f} s" if wall else ""))
        bubble = run.get("pp_bubble")
        if bubble:
            lines.append(f"    PP overlap (one chunk alone / per-chunk time of k at once): {bubble}")
        for row in run.get("prefill") or []:
            if row.get("latency_s_median"):
                k, length = int(row["concurrency"]), int(row["input_tokens"])
                predicted = chunked_prefill_s(model, k, length)
                lines.append(f"    prefill {k:2d} x {length:5d}: {row['latency_s_median'] * 1e3:8.1f} ms / "
                             f"{predicted * 1e3:8.1f} ms (model: the step loop's burst on an idle server, flag {model.chunked_prefill_tokens})")
    return lines


def vs_model_report(results: Path) -> list[str]:
    """The whole comparison for a two-GPU results folder (searched for collectives.json and calibration-twogpu*.json);
    FileNotFoundError when it holds no calibration file."""
    raws = _find(results, "calibration-twogpu*.json")
    if not raws:
        raise FileNotFoundError(f"{results}: no calibration-twogpu*.json under it")
    gpu = gpu_key(json.loads(read_text(raws[0]))["gpu"]["name"])
    lines: list[str] = []
    for path in _find(results, "collectives.json"):
        lines += collectives_table(path, gpu)
    for path in raws:
        lines += layout_tables(path)
    return lines
