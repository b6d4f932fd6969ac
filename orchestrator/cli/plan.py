"""`pd-orchestrator plan` (memory + deadline preflight, layout search) and `pd-orchestrator compare` (A/B)."""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from orchestrator.cli.args import add_config_args, add_overrides, config_from_args
from orchestrator.cluster.inventory import ClusterError, check_declared_placement, declared_nodes
from orchestrator.config import RunConfig, load_config
from orchestrator.perfmodel.costmodel import cost_model_for
from orchestrator.perfmodel.gpus import GPU_SPECS
from orchestrator.plan.backtest.band import (
    EAGER, ErrorBand, eager_class, error_band, out_of_sample_models, rows_text,
)
from orchestrator.plan.backtest.dataset import BacktestError
from orchestrator.plan.compare import MEASURED, SIM_ENGINE, compare, compare_table, find_real_run
from orchestrator.plan.deadline import INVALID, predict_deadline
from orchestrator.plan.eager_stretch import eager_stretches
from orchestrator.plan.memory.defaults_text import sglang_defaults_text
from orchestrator.plan.memory.preflight import check_layout_fits
from orchestrator.plan.proposals import add_search_args, print_search
from orchestrator.plan.search import PlanError
from orchestrator.plan.simulation.simulate import LABEL, SimulatedRun, SimulationError, batch_shapes
from orchestrator.rules import verdict_for
from orchestrator.stats import percentile


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--synthetic", action="store_true",
        help="use a synthetic ShareGPT-shaped batch instead of sampling ShareGPT (faster; less faithful)",
    )
    parser.add_argument("--disk-gb-s", type=float, default=2.0, help="weight read speed per node for real weights (GB/s)")
    parser.add_argument(
        "--jit-cold", action="store_true",
        help="engine start with empty compile caches (a fresh machine: every CUDA-graph batch size and the first "
        "forwards compile); the plan prints both the cold and the warm start either way",
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="memory + deadline preflight of a config; --search ranks the layouts that fit (simulated)",
    )
    add_config_args(p, required=False, help="run config YAML (see configs/); not needed with --backtest")
    p.add_argument("--gpu", choices=sorted(GPU_SPECS), help="target GPU (default: cluster.gpu)")
    p.add_argument(
        "--backtest", action="store_true",
        help="reprint the back-test: every recorded real run predicted from its conditions with the shipped "
        "calibration profiles (benchmarks/backtest/runs.yaml), measured vs predicted and the error",
    )
    p.add_argument("--markdown", action="store_true", help="with --backtest: a Markdown table (docs/fidelity.md)")
    p.add_argument("--closed-loop", action="store_true",
                   help="with --backtest: the closed-loop (AIPerf goodput) rows of benchmarks/backtest/closed_loop.yaml "
                   "instead: predicted now vs measured, the bound set before each run, a pre-registered prediction's error")
    p.add_argument("--search", action="store_true", help="enumerate layouts of the cluster and rank them")
    p.add_argument("--top", type=int, default=None,
                   help="with --search: print the best N layouts, and write them with --write-dir (default: 25 "
                   "printed, 3 written)")
    p.add_argument("--write-dir", help="write the top layouts here as ready run configs")
    p.add_argument("--concurrency", help="closed-loop workloads: the declared concurrencies N to predict, "
                   "comma-separated, e.g. 24,32,48 (default benchmark.concurrency)")
    p.add_argument("--json", metavar="PATH", help="closed-loop workloads: write the per-N rows (concurrency, "
                   "output_tok_s, good_output_tok_s, good_fraction, ttft_ms, itl_ms), the best N and the time to ready")
    add_search_args(p)
    _add_common(p)
    p.set_defaults(func=_cmd_plan)

    c = sub.add_parser("compare", help="A/B: the same sampled batch on several configs, one table")
    c.add_argument("--configs", nargs="+", required=True, metavar="CONFIG.yaml", help="configs to compare; ratios are to the first")
    mode = c.add_mutually_exclusive_group()
    mode.add_argument("--simulate", action="store_true", default=True, help="virtual-time simulation (default)")
    mode.add_argument("--real", action="store_true", help="run each config for real with `bench` (slow; needs the cluster)")
    add_overrides(c, help="override one config key (applied to every config), e.g. --set benchmark.num_prompts=200")
    _add_common(c)
    c.set_defaults(func=_cmd_compare)


def _batch(cfg: RunConfig, synthetic: bool) -> tuple[list[tuple[int, int]], str]:
    batch, source = batch_shapes(cfg, synthetic)
    inputs, outputs = sum(p for p, _ in batch), sum(o for _, o in batch)
    bench = cfg.benchmark
    return batch, (f"{len(batch)} prompts ({source}, seed {bench.seed}, {bench.ordering} order): {inputs:,} input + "
                   f"{outputs:,} output tokens")


def _search_batch(cfg: RunConfig, args: argparse.Namespace, batch: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The batch the search ranks on: the rules profile's prompt count where it fixes another one (the final
    2025 rules run 2000 prompts; the embedded default plans 1000), sampled the same way; else `batch`."""
    name = args.rules or cfg.rules
    if not name:
        return batch
    from orchestrator.rules import load_profile

    wanted = load_profile(name).benchmark.num_prompts
    if not wanted or wanted == cfg.benchmark.num_prompts:
        return batch
    ruled = cfg.model_copy(update={"benchmark": cfg.benchmark.model_copy(update={"num_prompts": wanted})})
    search_batch, about = _batch(ruled, args.synthetic)
    print(f"search batch (rules {name}: the contest's prompt count): {about}\n")
    return search_batch


def _cmd_backtest(markdown: bool) -> int:
    from orchestrator.plan.backtest.predict import run_backtest
    from orchestrator.plan.backtest.report import backtest_table, summary

    try:
        rows = run_backtest()
    except (BacktestError, SimulationError, ValueError) as exc:
        print(f"plan --backtest: {exc}", file=sys.stderr)
        return 2
    print(backtest_table(rows, markdown=markdown))
    print("\n" + summary(rows))
    return 1 if any(r.regressed for r in rows) else 0  # a reported miss is a finding, not a failure


def _cmd_closed_loop_backtest(markdown: bool) -> int:
    from orchestrator.plan.closedloop.backtest import closed_loop_backtest, closed_loop_table

    try:
        checks = closed_loop_backtest()
    except (SimulationError, ValueError) as exc:
        print(f"plan --backtest --closed-loop: {exc}", file=sys.stderr)
        return 2
    print(closed_loop_table(checks, markdown=markdown))
    return 0  # a miss against a bound set before the run is a finding, reported, not a failure


def _cmd_plan(args: argparse.Namespace) -> int:
    if args.backtest:
        return _cmd_closed_loop_backtest(args.markdown) if args.closed_loop else _cmd_backtest(args.markdown)
    if not args.config:
        print("plan needs --config FILE (or --backtest)", file=sys.stderr)
        return 2
    cfg = config_from_args(args)
    gpu = args.gpu or cfg.cluster.gpu
    if cfg.benchmark.closed_loop:
        return _cmd_plan_closed_loop(cfg, args, gpu)
    if args.concurrency or args.json:
        flag = "--concurrency" if args.concurrency else "--json"
        print(f"plan: {flag} applies to closed-loop workloads; set benchmark.kind: closed_loop (with --set "
              "benchmark.kind=closed_loop) or drop the flag", file=sys.stderr)
        return 2
    if args.write_dir and not args.search:
        print("--write-dir needs --search (it writes the ranked layouts)", file=sys.stderr)
        return 2
    if args.top is not None and args.top < 1:
        print(f"--top must be >= 1, got {args.top}", file=sys.stderr)
        return 2
    show = args.show if args.show is not None else (args.top or 25)
    band_printed = False
    try:
        batch, about = _batch(cfg, args.synthetic)
        cluster = f"{cfg.cluster.num_nodes}x{cfg.cluster.gpus_per_node} {gpu}"
        print(f"plan: {cfg.name} ({cfg.layout.describe()}) on {cluster}, {cfg.model.name} {cfg.model.quantization.upper()}")
        print(f"batch: {about}\n")
        verdict = verdict_for(cfg, args.rules)
        if verdict is not None:
            print(verdict.summary() + "\n")
        ok = _print_placement(cfg)
        memory = check_layout_fits(cfg, batch, gpu=gpu) if ok else None
        if memory is not None:
            print(memory.table())
            print(memory.summary())
            print(sglang_defaults_text(cfg, gpu) + "\n")
            ok = memory.fits
        if memory is not None and memory.fits:
            budget = predict_deadline(cfg, batch, gpu=gpu, disk_gb_s=args.disk_gb_s, jit_cached=not args.jit_cold)
            print(f"deadline budget ({LABEL} on {gpu}, engine={cfg.engine.kind}):")
            print(budget.table())
            _print_lent_routing(cfg, gpu)
            print()
            ok = budget.verdict != INVALID
            band = _error_band(cfg)
            share = budget.run.eager_share
            print(f"back-test error band of this throughput: {band.text(share) if band else _no_band(cfg)} "
                  "(`plan --backtest`)")
            if eager_class(share) == EAGER:
                for stretch in eager_stretches(cfg, budget.run, batch, gpu):
                    print(f"  {stretch.line()}")
            print()
            band_printed = True
            _print_earlier_run(cfg, budget.run, band)
        if args.search:
            batch = _search_batch(cfg, args, batch)
            ok = print_search(cfg, batch, gpu, rules=args.rules, top=args.top or 3, write_dir=args.write_dir,
                              tune_top=args.tune_top, show=show, disk_gb_s=args.disk_gb_s,
                              jit_cached=not args.jit_cold, band=_error_band(cfg))
            if not band_printed:  # the config's own layout did not fit: the ranking still gets its band (issue 25)
                band = _error_band(cfg)
                print(f"back-test error band of the ranked throughputs: {band.text() if band else _no_band(cfg)} "
                      "(`plan --backtest`)")
    except (PlanError, SimulationError, ValueError) as exc:
        print(f"plan: {exc}", file=sys.stderr)
        return 2
    return 0 if ok else 1


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


def _cmd_plan_closed_loop(cfg: RunConfig, args: argparse.Namespace, gpu: str) -> int:
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
                                            band=_closed_loop_band_text(cfg), top=args.top or 3,
                                            write_dir=args.write_dir)
        verdict = verdict_for(cfg, args.rules)
        if verdict is not None:
            print(verdict.summary() + "\n")
        if not _print_placement(cfg):
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
    print(prediction.verdict())
    print(prediction.ready.line())
    band = _closed_loop_band_text(cfg)
    print(f"back-test error band: {band}")
    for line in calibration_sources(cfg, gpu):
        print(f"  {line}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(prediction.as_json(band), indent=2) + "\n")
        print(f"rows: {args.json}")
    return 0 if prediction.best is not None else 1


def _closed_loop_band_text(cfg: RunConfig) -> str:
    """The closed-loop back-test's error for this model where it has measured points; else the batch back-test's
    band (`plan --backtest`; TTFT, ITL and goodput not back-tested) or "no out-of-sample rows yet"."""
    from orchestrator.plan.closedloop.backtest import closed_loop_band

    closed = closed_loop_band(cfg.model.architecture().name)
    if closed is not None:
        return closed.text()
    band = _error_band(cfg)
    return ("batch throughput " + band.text() + " (`plan --backtest`; TTFT, ITL and goodput are not back-tested)"
            if band else _no_band(cfg))


def _print_lent_routing(cfg: RunConfig, gpu: str) -> None:
    """A group whose expert reads follow another profile's dummy-weight routing curve says so (lent_routing_note)."""
    for role, i, group in cfg.layout.groups():
        if note := cost_model_for(cfg, role, group, gpu=gpu).lent_routing_note():
            print(f"  layout.{role}.{i}: {note}")


def _print_placement(cfg: RunConfig) -> bool:
    """GPUs per node and role against the declared cluster, the check bench makes at placement; True if it fits."""
    try:
        check_declared_placement(cfg)
    except ClusterError as exc:
        for line in str(exc).splitlines():
            print(f"placement: {line}")
        print("placement: does not fit -> INVALID (memory and deadline not checked)\n")
        return False
    nodes = declared_nodes(cfg)
    key = cfg.cluster.roles.label_key
    roles = ", ".join(f"{key}={v}: {sum(n.labels[key] == v for n in nodes)}" for v in dict.fromkeys(n.labels[key] for n in nodes))
    declared = "" if cfg.cluster.is_local else "; as declared: bench checks the real labels at placement"
    print(f"placement: fits ({len(nodes)} nodes x {cfg.cluster.gpus_per_node} GPUs by role: {roles}{declared})\n")
    return True


def _error_band(cfg: RunConfig) -> ErrorBand | None:
    """The back-test's out-of-sample full-run band (calibration points' figure beside it), when it has full runs of
    this config's model (None otherwise)."""
    try:
        if cfg.model.architecture().name not in out_of_sample_models():
            return None
        return error_band()
    except (BacktestError, SimulationError, ValueError, OSError):
        return None


def _no_band(cfg: RunConfig) -> str:
    name = cfg.model.architecture().name
    try:
        measured = out_of_sample_models()
    except (BacktestError, ValueError, OSError):
        return "none recorded"
    return "none recorded" if name in measured else f"no out-of-sample rows yet for {name}"


TTFT_DISAGREES = 0.25  # TTFT is not back-tested: flag a run whose p50 is this far from the prediction


def _print_earlier_run(cfg: RunConfig, predicted: SimulatedRun, band: ErrorBand | None) -> None:
    """Predicted vs an earlier bench run of this layout under benchmark.result_dir (simulated engine: a simulated
    run), with every disagreement beyond the back-test's band flagged."""
    found = find_real_run(cfg)
    if found is None:
        return
    path, run = found
    what = f"{SIM_ENGINE} run (bench on the simulated engine)" if cfg.simulated else f"{MEASURED} run (bench on SGLang)"
    run_tok_s = run.output_tokens / run.duration_s
    run_ttft = percentile(run.ttft_s, 50) if run.ttft_s else math.nan
    error = predicted.output_throughput / run_tok_s - 1
    print(
        f"{what} ({path}): {run_tok_s:,.0f} out tok/s, run {run.duration_s:.1f} s, TTFT p50 {run_ttft:.2f} s; "
        f"predicted {predicted.output_throughput:,.0f} out tok/s, run {predicted.duration_s:.1f} s, TTFT p50 "
        f"{predicted.ttft_p(50):.2f} s (throughput error {error:+.0%})"
    )
    if band is not None and abs(error) > band.class_mape(predicted.eager_share):
        print(f"  disagreement: output tok/s {error:+.0%}, outside the back-test's "
              f"±{band.class_mape(predicted.eager_share):.0%} band (this prediction's class)")
    ttft_error = predicted.ttft_p(50) / run_ttft - 1 if run_ttft > 0 else math.nan
    if abs(ttft_error) > TTFT_DISAGREES:
        print(f"  disagreement: TTFT p50 predicted {predicted.ttft_p(50):.2f} s vs {run_ttft:.2f} s in that run "
              f"({ttft_error:+.0%}; TTFT is not back-tested, so trust the run)")
    print()


def _cmd_compare(args: argparse.Namespace) -> int:
    configs = [(path.rsplit("/", 1)[-1].removesuffix(".yaml"), load_config(path, args.overrides)) for path in args.configs]
    first = configs[0][1]
    if first.benchmark.closed_loop:
        return _compare_closed_loop(configs, args)
    try:
        batch, about = _batch(first, args.synthetic)
        differs = [name for name, cfg in configs[1:] if cfg.benchmark.model_dump() != first.benchmark.model_dump()]
        print(f"compare: the same batch on {len(configs)} configs: {about}")
        if differs:
            print(f"  note: {', '.join(differs)} have other benchmark settings; the first config's batch is used for all")
        started = time.monotonic()
        measure = _bench_measure if args.real else None
        rows = compare(configs, batch, measure=measure, disk_gb_s=args.disk_gb_s, jit_cached=not args.jit_cold)
    except (SimulationError, ValueError) as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    print(compare_table(rows))
    print(
        f"({LABEL} rows: virtual time on each config's cluster.gpu via the cost model, "
        f"{time.monotonic() - started:.1f} s of CPU; ratio = output throughput / the first config's)"
    )
    band = _error_band(first)
    if band is not None and any(row.source == LABEL for row in rows):
        shares = {row.name: row.eager_share for row in rows if row.source == LABEL and row.eager_share is not None}
        print(f"back-test error band of the {LABEL} throughputs, by each row's class: {rows_text(band, shares)} "
              "(`plan --backtest`)")
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
        print(compare_table(compare_closed_loop(configs)))
    except (SimulationError, ValueError) as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    return 0


def _bench_measure(cfg: RunConfig):
    """--real: run the config with `bench` (the planner gets this function; plan never imports run)."""
    from orchestrator.run.bench import run_bench

    return run_bench(cfg)
