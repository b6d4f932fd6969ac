"""Calibration raw file (`pdo-calibration-raw/1`, written by orchestrator/calibrate on the GPU) -> profile.

raw JSON -> CalibrationProfile (perfmodel/profile.py): GPU and model from the raw header; decode points
from every run's decode / context / beyond rows (running batch, the KV tokens SGLang logged, median step,
graph or eager); prefill points from the prefill rows (k requests of L tokens, 1 output token: the
median request latency, one or more chunked forwards); start-ups from each run (cold or warm caches,
ready time, SGLang's own phase timings, graph capture and its batch sizes); memory outcomes (the
fraction SGLang used, GPU memory free after start from its limits line, OOM or not).

Run: python -m orchestrator.perfmodel.from_raw RAW.json --raw-dir benchmarks/results/<dir>/ --out PROFILE.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from orchestrator.compressed import read_text
from orchestrator.perfmodel.profile import CalibrationProfile

GPU_NAMES = {"H200": "H200", "H100": "H100-SXM"}


def gpu_key(device_name: str) -> str:
    """'NVIDIA H200' -> 'H200', 'NVIDIA H100 80GB HBM3' -> 'H100-SXM'; unknown -> ValueError naming it."""
    for token, key in GPU_NAMES.items():
        if token in device_name:
            return key
    raise ValueError(f"gpu.name={device_name!r} has no cost-model GPU; known: {sorted(GPU_NAMES)}")


def _quantization(config: dict) -> str:
    method = (config.get("quantization_config") or {}).get("quant_method")
    return "fp8" if method == "fp8" else "bf16"


def _decode_points(run: dict) -> list[dict]:
    points = []
    for key in ("decode", "context", "beyond"):
        for row in run.get(key) or []:
            if not row.get("step_ms_median") or row.get("skipped"):
                continue
            running = int(row.get("running_batch") or row["batch_size"])
            context = row.get("kv_tokens_median") or running * (row["context_tokens"] + row.get("decode_steps", 100) // 2)
            points.append({
                "batch_size": running, "context_tokens": int(context), "step_s": row["step_ms_median"] / 1e3,
                "cuda_graph": bool(row.get("cuda_graph")), "steps": max(1, int(row.get("samples") or 1)) * 40,
            })
    return points


def _prefill_points(run: dict) -> list[dict]:
    points = []
    for row in run.get("prefill") or []:
        if not row.get("latency_s_median") or row.get("skipped") or row.get("errors"):
            continue
        k, length = int(row["concurrency"]), int(row["input_tokens"])
        if k * length < 1024:  # scheduling and HTTP overhead dominate the forward
            continue
        points.append({"new_tokens": k * length, "requests": k, "cached_tokens": 0, "time_s": row["latency_s_median"]})
    return points


def _startup(run: dict) -> dict | None:
    if not run.get("ready_after_s"):
        return None
    st = run.get("startup") or {}
    sglang = (run.get("derived") or {}).get("startup_time_s") or {}
    graphs = [g for g in st.get("cuda_graphs", []) if g.get("kind", "decode").strip() in ("decode", "")]
    graph_s = (sglang.get("cuda_graph") or {}).get("decode") if isinstance(sglang.get("cuda_graph"), dict) else None
    if graph_s is None and graphs:
        graph_s = sum(g.get("capture_s", 0.0) for g in graphs)
    return {
        "caches": run.get("cache_state") or "warm", "role": "aggregated", "ready_s": run["ready_after_s"],
        "weights_s": sglang.get("load_weight", st.get("load_weight_s")),
        "kv_alloc_s": sglang.get("kv_cache_allocation"),
        "graph_capture_s": graph_s, "graph_batch_sizes": len(graphs[0]["bs"]) if graphs else None,
        "tokenizer_s": sglang.get("tokenizer_e2e"),
    }


def _memory(run: dict) -> dict | None:
    derived = run.get("derived") or {}
    limits = (run.get("startup") or {}).get("limits") or {}
    fraction = derived.get("mem_fraction_static")
    if fraction is None:
        return None
    died = bool(run.get("oom_in_log")) or bool(run.get("server_died"))
    return {
        "mem_fraction_static": fraction, "chunked_prefill_size": int(derived.get("chunked_prefill_size") or 8192),
        "cuda_graph_max_bs": derived.get("cuda_graph_decode_max_bs"), "outcome": "oom" if died else "ran",
        "load": f"calibration variant {run.get('variant')}: {', '.join(run.get('measure') or []) or 'start only'}",
        "free_after_init_gb": limits.get("available_gpu_mem"),
        "weights_gb": (run.get("startup") or {}).get("weights_gb"),
        "max_total_num_tokens": derived.get("max_total_num_tokens"),
    }


def _attention_dims(cfg: dict) -> dict:
    """MLA's latent dims; a GQA layer (Qwen3: num_key_value_heads, no kv_lora_rank) has none (0, as its preset)."""
    if "kv_lora_rank" not in cfg and "num_key_value_heads" in cfg:
        return {"kv_lora_rank": 0, "qk_rope_head_dim": 0}
    missing = [k for k in ("kv_lora_rank", "qk_rope_head_dim") if k not in cfg]
    if missing:
        raise ValueError(f"model.config.{missing[0]} missing: an MLA config needs kv_lora_rank and qk_rope_head_dim, "
                         "a GQA one num_key_value_heads")
    return {"kv_lora_rank": cfg["kv_lora_rank"], "qk_rope_head_dim": cfg["qk_rope_head_dim"]}


def profile_from_raw(raw: dict, raw_dir: str, command: str, created: str = "", purpose: str = "calibration") -> CalibrationProfile:
    """One profile from one raw single-server calibration file (validated; bad input -> ValueError)."""
    if raw.get("schema") != "pdo-calibration-raw/1":
        raise ValueError(f"schema={raw.get('schema')!r}: expected 'pdo-calibration-raw/1'")
    cfg = raw["model"]["config"]
    runs = [r for r in raw.get("runs", []) if not r.get("skipped")]
    base = next((r for r in runs if r.get("derived") and not r.get("flags")), None) or next(
        (r for r in runs if r.get("derived")), None
    )
    if base is None:
        raise ValueError("runs: no run reached /server_info; nothing to build a profile from")
    d = base["derived"]
    name = raw.get("name") or Path(raw["model"]["path"]).name
    profile = {
        "schema_version": 1,
        "name": f"{gpu_key(raw['gpu']['name']).lower()}-{name}-sglang{raw.get('sglang_version') or d.get('version')}",
        "created": created, "command": command, "raw": raw_dir, "purpose": purpose,
        "gpu": {"name": gpu_key(raw["gpu"]["name"]), "device_name": raw["gpu"]["name"],
                "memory_mib": int(raw["gpu"]["memory_total_mib"]), "count": 1},
        "model": {
            "name": name, "hidden_size": cfg["hidden_size"], "num_hidden_layers": cfg["num_hidden_layers"],
            "first_k_dense_replace": cfg.get("first_k_dense_replace", 0),
            "n_routed_experts": cfg.get("n_routed_experts") or cfg.get("num_experts") or 0,  # Qwen3: num_experts
            "num_experts_per_tok": cfg.get("num_experts_per_tok") or 0, "moe_intermediate_size": cfg.get("moe_intermediate_size", 0),
            "num_attention_heads": cfg["num_attention_heads"], **_attention_dims(cfg), "quantization": _quantization(cfg),
        },
        "engine": {
            "sglang_version": str(raw.get("sglang_version") or d.get("version")),
            "attention_backend": str(d.get("attention_backend")), "tp": int(d.get("tp_size") or 1),
            "page_size": int(d.get("page_size") or 1), "context_length": d.get("context_length"),
            "extra_args": list(raw.get("common_flags") or []),
            "reported_max_total_num_tokens": d.get("max_total_num_tokens"),
            "reported_max_running_requests": d.get("max_running_requests"),
            "reported_chunked_prefill_size": d.get("chunked_prefill_size"),
            "reported_cuda_graph_batch_sizes": d.get("cuda_graph_decode_bs"),
        },
        "decode": [p for r in runs for p in _decode_points(r)],
        "prefill": [p for r in runs for p in _prefill_points(r)],
        "startup": [s for r in runs if (s := _startup(r))],
        "memory": [m for r in runs if (m := _memory(r))],
        "notes": [f"from {raw_dir} ({len(runs)} runs: {', '.join(r.get('variant', '?') for r in runs)})"],
    }
    return CalibrationProfile.model_validate(profile)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", help="calibration-<name>.json written by the harness (or its committed .json.xz)")
    ap.add_argument("--raw-dir", required=True, help="where the raw files are committed (benchmarks/results/...)")
    ap.add_argument("--out", required=True, help="profile JSON to write (orchestrator/perfmodel/profiles/...)")
    ap.add_argument("--command", default="pd-orchestrator calibrate", help="the command that produced the raw files")
    ap.add_argument("--created", default="", help="UTC date-time of the measurement")
    ap.add_argument("--purpose", default="calibration", choices=["calibration", "layer-count"],
                    help="layer-count: one of several layer counts of a shape measured on one host, which only splits the "
                    "fixed time of a graphed step (never a server's calibration)")
    args = ap.parse_args(argv)
    try:
        profile = profile_from_raw(json.loads(read_text(args.raw)), args.raw_dir, args.command, args.created,
                                   args.purpose)
    except (OSError, ValueError, KeyError) as exc:
        print(f"from_raw: {args.raw}: {exc}", file=sys.stderr)
        return 2
    Path(args.out).write_text(profile.model_dump_json(indent=1, exclude_none=True) + "\n")
    print(f"wrote {args.out}: {len(profile.decode)} decode, {len(profile.prefill)} prefill, "
          f"{len(profile.startup)} start-up, {len(profile.memory)} memory points")
    return 0


if __name__ == "__main__":
    sys.exit(main())
