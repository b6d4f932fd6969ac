"""The planner's eager decode step for the in-run eager measurement (issue 25, scripts/device/eager_inrun.sh), printed
before the run: the lone V2-Lite servers' rounds (TP 1 at batch 300 / 450 / 600, TP 2 at 300 / 600) and the in-run
PD decode's eager batches (257-700), each as the planner's step = max(GPU work, CPU launch) with both parts shown.

The servers are the ones the script starts, built by the product's own path (config -> ServerSpec -> cost model):
TP 1 = configs/device-h200x2-local-agg-tp2.yaml with tp 1, mem 0.65, graphs to 256 (the PD decode's flags); TP 2 =
the same file at mem 0.80 (lease 4's product row); PD decode = configs/device-h200x2-local-1p1d.yaml's decode at 0.65.
Context per request = 330 prompt tokens + half of the 64 new ones (the rounds' mean), the decode's in-run context
from `--pd-context` (default 360: ShareGPT's mean prompt 341 + part of its output, as the analysis' model line).

Usage (no GPU; the configs and the model folder are read from the repository root, whatever the working
directory): .venv/bin/python benchmarks/eager_inrun_predict.py [--gpu H100-SXM] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.config import load_config  # noqa: E402
from orchestrator.records import Role  # noqa: E402
from orchestrator.perfmodel.costmodel import cost_model_for  # noqa: E402

AGG = "configs/device-h200x2-local-agg-tp2.yaml"
PD = "configs/device-h200x2-local-1p1d.yaml"
MODEL = "models/deepseek-v2-lite"


def server_model(config: str, role: Role, sets: list[str], gpu: str):
    cfg = load_config(ROOT / config, [f"model.path={MODEL}", f"cluster.gpu={gpu}", *sets], paths_from=ROOT)
    return cost_model_for(cfg, role, getattr(cfg.layout, role)[0])


def step_row(model, batch: int, ctx_per_request: float) -> dict:
    ctx = batch * ctx_per_request
    launch = model.eager_launch_s(batch)
    graphed_like = model._decode_forward_s(batch, ctx, False, 1)   # the same GPU work without the eager launch floor
    step = model.decode_step_s(batch, ctx)
    return {"batch": batch, "eager": model.decode_runs_eager(batch), "step_ms": round(1e3 * step, 2),
            "cpu_launch_ms": round(1e3 * launch, 2), "gpu_work_ms": round(1e3 * graphed_like, 2),
            "bound": "launch" if launch >= graphed_like else "gpu"}


def server_rows(model, batches: list[int], ctx_per_request: float, title: str) -> dict:
    """The model's step at each batch, printed as a table under `title`; the JSON form of one server."""
    rows = [step_row(model, b, ctx_per_request) for b in batches]
    print(f"== {title}, context {ctx_per_request:.0f} tokens per request")
    print("  batch  eager  step ms  (CPU launch ms, GPU work ms, bound)")
    for r in rows:
        print(f"  {r['batch']:5d}  {'yes' if r['eager'] else 'no':>5}  {r['step_ms']:7.2f}  "
              f"({r['cpu_launch_ms']:.2f}, {r['gpu_work_ms']:.2f}, {r['bound']})")
    return {"context_per_request": ctx_per_request, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="H100-SXM")
    ap.add_argument("--pd-context", type=float, default=360.0)
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args(argv)
    lone_ctx = 330 + 64 / 2
    servers = {
        "lone TP 1 (B1-B4)": (server_model(AGG, "aggregated", ["layout.aggregated.0.tp=1",
                                                                "layout.aggregated.0.mem_fraction_static=0.65"], args.gpu),
                              [300, 450, 600], lone_ctx),
        "lone TP 2 (item 2)": (server_model(AGG, "aggregated", ["layout.aggregated.0.mem_fraction_static=0.80"], args.gpu),
                               [300, 600], lone_ctx),
        "in-run PD decode (A)": (server_model(PD, "decode", ["layout.decode.0.mem_fraction_static=0.65"], args.gpu),
                                 [257, 300, 400, 500, 600, 700], args.pd_context),
    }
    out = {}
    for name, (model, batches, ctx) in servers.items():
        out[name] = server_rows(model, batches, ctx, f"{name} on {args.gpu}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
