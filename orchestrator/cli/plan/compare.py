"""`pd-orchestrator compare`: the same sampled batch on several configs, simulated (virtual time) or run for real with
`bench`, in one table; a closed-loop workload compared under the first config's loop."""

from __future__ import annotations

import argparse
import math
import sys
import time

from orchestrator.cli.plan.bands import error_band_of
from orchestrator.cli.plan.finite import batch_about
from orchestrator.config import RunConfig, load_config
from orchestrator.plan.backtest.band import rows_text
from orchestrator.plan.compare import MEASURED, SIM_ENGINE, compare, compare_table
from orchestrator.plan.simulation.runs import LABEL, SimulationError
from orchestrator.plan.simulation.servers import priced_pairing_compare_note


def cmd_compare(args: argparse.Namespace) -> int:
    configs = [(path.rsplit("/", 1)[-1].removesuffix(".yaml"), load_config(path, args.overrides)) for path in args.configs]
    first = configs[0][1]
    if first.benchmark.closed_loop:
        return _compare_closed_loop(configs, args)
    try:
        batch, about = batch_about(first, args.synthetic)
        differs = [name for name, cfg in configs[1:] if cfg.benchmark.model_dump() != first.benchmark.model_dump()]
        print(f"compare: the same batch on {len(configs)} configs: {about}")
        if differs:
            print(f"  note: {', '.join(differs)} have other benchmark settings; the first config's batch is used for all")
        bench_cpu_s: list[float] = []

        def bench_measure(cfg: RunConfig):
            started_s = time.process_time()
            try:
                return _bench_measure(cfg)
            finally:
                bench_cpu_s.append(time.process_time() - started_s)

        started_cpu_s = time.process_time()
        measure = bench_measure if args.real else None
        rows = compare(configs, batch, measure=measure, disk_gb_s=args.disk_gb_s, jit_cached=not args.jit_cold)
        simulated_cpu_s = time.process_time() - started_cpu_s - sum(bench_cpu_s)
    except (SimulationError, ValueError) as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    print(compare_table(rows))
    print(
        f"({LABEL} rows: virtual time on each config's cluster.gpu via the cost model, "
        f"{simulated_cpu_s:.1f} s of CPU; ratio = output throughput / the first config's)"
    )
    band = error_band_of(first)
    if band is not None and any(row.source == LABEL for row in rows):
        shares = {row.name: row.eager_share for row in rows if row.source == LABEL and row.eager_share is not None}
        print(f"back-test error band of the {LABEL} throughputs, by each row's class: {rows_text(band, shares)} "
              "(`plan --backtest`)")
    simulated = {row.name for row in rows if row.source == LABEL and not math.isnan(row.output_throughput)}
    if note := priced_pairing_compare_note([(name, cfg) for name, cfg in configs if name in simulated]):
        print(f"  {note}")
    sources = {row.source for row in rows}
    if SIM_ENGINE in sources:
        print(f"({SIM_ENGINE} rows: a bench run on the simulated engine, its wall time: simulated, no GPU measured)")
    if MEASURED in sources:
        print(f"({MEASURED} rows: a bench run on SGLang, measured on the GPUs)")
    return 0


def _compare_closed_loop(configs: list[tuple[str, RunConfig]], args: argparse.Namespace) -> int:
    from orchestrator.plan.closedloop.predict import compare_closed_loop, compare_table

    if args.real:
        print("compare --real: a closed-loop workload is measured with `serve` + `goodput` on each config",
              file=sys.stderr)
        return 2
    b = configs[0][1].benchmark
    print(f"compare: {len(configs)} configs under one closed loop (the first config's): ISL {b.input_tokens} / OSL "
          f"{b.output_tokens}, N {','.join(map(str, b.concurrency))}, window {b.window_s:g} s + grace {b.grace_s:g} s, "
          f"TTFT <= {b.slo.ttft_ms:g} ms, ITL <= {b.slo.itl_ms:g} ms, gate >= {b.slo.min_good_fraction:.2f}")
    try:
        results = compare_closed_loop(configs)
        table = compare_table(results)
    except (SimulationError, ValueError) as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    print(table)
    ran = {name for name, prediction in results if not isinstance(prediction, str)}
    if note := priced_pairing_compare_note([(name, cfg) for name, cfg in configs if name in ran]):
        print(f"  {note}")
    return 0


def _bench_measure(cfg: RunConfig):
    """--real: run the config with `bench` (the planner gets this function; plan never imports run)."""
    from orchestrator.run.bench import run_bench

    return run_bench(cfg)
