"""`plan` of a closed-loop workload: the per-N prediction with its SLA gate and time to ready (or, with --search, the
layouts ranked by good tok/s)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from orchestrator.cli.plan.bands import closed_loop_band_text
from orchestrator.cli.plan.placement import print_placement
from orchestrator.config import RunConfig
from orchestrator.plan.memory.preflight import check_layout_fits
from orchestrator.plan.search import PlanError
from orchestrator.plan.simulation.runs import SimulationError
from orchestrator.plan.simulation.servers import priced_pairing_note, same_gpu_kv_note
from orchestrator.rules import verdict_for


def _concurrencies(text: str | None) -> list[int] | None:
    if not text:
        return None
    try:
        ns = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        ns = []
    if not ns or min(ns) < 1:
        raise ValueError(f"--concurrency {text!r}: give positive integers, e.g. --concurrency 24,32,48")
    return ns


def cmd_plan_closed_loop(cfg: RunConfig, args: argparse.Namespace, gpu: str) -> int:
    """Per-N prediction of a closed-loop workload (or, with --search, the layouts ranked by good tok/s)."""
    from orchestrator.plan.closedloop.predict import calibration_sources, predict_closed_loop

    b = cfg.benchmark
    try:
        ns = _concurrencies(args.concurrency)
        cluster = f"{cfg.cluster.num_nodes}x{cfg.cluster.gpus_per_node} {gpu}"
        print(f"plan: {cfg.name} ({cfg.layout.describe()}) on {cluster}, {cfg.model.name} {cfg.model.quantization.upper()}")
        print(f"workload: closed loop, ISL {b.input_tokens} / OSL {b.output_tokens}, N {','.join(map(str, ns or b.concurrency))}; "
              f"window {b.window_s:g} s + grace {b.grace_s:g} s (warm-up {b.warmup_s:g} s: its requests end before the "
              f"window, not simulated); SLO TTFT <= {b.slo.ttft_ms:g} ms, ITL <= {b.slo.itl_ms:g} ms, gate good "
              f"fraction >= {b.slo.min_good_fraction:.2f}\n")
        if args.search:
            from orchestrator.plan.closedloop.search import print_closed_loop_search

            return print_closed_loop_search(cfg, gpu, args.rules, ns, show=args.show or args.top or 25,
                                            band=closed_loop_band_text(cfg), top=args.top or 3,
                                            write_dir=args.write_dir)
        verdict = verdict_for(cfg, args.rules)
        if verdict is not None:
            print(verdict.summary() + "\n")
        if not print_placement(cfg):
            return 1
        memory = check_layout_fits(cfg, [(b.input_tokens, b.output_tokens)] * max(ns or b.concurrency), gpu=gpu)
        print(memory.table())
        print(memory.summary() + "\n")
        if not memory.fits:
            return 1
        prediction = predict_closed_loop(cfg, ns, gpu, disk_gb_s=args.disk_gb_s, jit_cached=not args.jit_cold)
    except (PlanError, SimulationError, ValueError) as exc:
        print(f"plan: {exc}", file=sys.stderr)
        return 2
    print(prediction.table())
    if note := priced_pairing_note(cfg):
        print(f"  {note}")
    if note := same_gpu_kv_note(cfg):
        print(f"  {note}")
    print(prediction.verdict())
    print(prediction.ready.line())
    band = closed_loop_band_text(cfg)
    print(f"back-test error band: {band}")
    for line in calibration_sources(cfg, gpu):
        print(f"  {line}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(prediction.as_json(band), indent=2) + "\n")
        print(f"rows: {args.json}")
    return 0 if prediction.best is not None else 1
