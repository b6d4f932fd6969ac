"""`plan --config X` of a finite batch: placement, memory, the deadline budget with the back-test's band, an earlier
run of the layout beside the prediction, and with --search the ranked layouts. A closed-loop workload goes to
closed_loop.py, --backtest to backtest.py."""

from __future__ import annotations

import argparse
import math
import sys

from orchestrator.cli.args import config_from_args
from orchestrator.cli.plan.backtest import cmd_backtest, cmd_closed_loop_backtest
from orchestrator.cli.plan.bands import error_band_of, no_band_text
from orchestrator.cli.plan.closed_loop import cmd_plan_closed_loop
from orchestrator.cli.plan.placement import print_lent_calibration, print_placement
from orchestrator.config import RunConfig
from orchestrator.plan.backtest.band import EAGER, ErrorBand, eager_class
from orchestrator.plan.compare import MEASURED, SIM_ENGINE, find_real_run
from orchestrator.plan.deadline import INVALID, predict_deadline
from orchestrator.plan.eager_stretch import eager_stretches
from orchestrator.plan.memory.defaults_text import sglang_defaults_text
from orchestrator.plan.memory.preflight import check_layout_fits
from orchestrator.plan.proposals import print_search
from orchestrator.plan.search import PlanError
from orchestrator.plan.simulation.runs import LABEL, SimulatedRun, SimulationError, batch_shapes
from orchestrator.plan.simulation.servers import priced_pairing_note, same_gpu_kv_note
from orchestrator.rules import verdict_for
from orchestrator.stats import percentile


def batch_about(cfg: RunConfig, synthetic: bool) -> tuple[list[tuple[int, int]], str]:
    batch, source = batch_shapes(cfg, synthetic)
    inputs, outputs = sum(p for p, _ in batch), sum(o for _, o in batch)
    bench = cfg.benchmark
    return batch, (f"{len(batch)} prompts ({source}, seed {bench.seed}, {bench.ordering} order): {inputs:,} input + "
                   f"{outputs:,} output tokens")


def _search_batch(cfg: RunConfig, args: argparse.Namespace, batch: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The batch the search ranks on: the rules profile's prompt count where it fixes another one (the final
    2025 rules run 2000 prompts; the embedded default plans 1000), sampled the same way; else `batch`."""
    from orchestrator.rules import load_profile, profile_name

    name = profile_name(args.rules, cfg.rules)
    if not name:
        return batch

    wanted = load_profile(name).benchmark.num_prompts
    if not wanted or wanted == cfg.benchmark.num_prompts:
        return batch
    ruled = cfg.model_copy(update={"benchmark": cfg.benchmark.model_copy(update={"num_prompts": wanted})})
    search_batch, about = batch_about(ruled, args.synthetic)
    print(f"search batch (rules {name}: the contest's prompt count): {about}\n")
    return search_batch

def cmd_plan(args: argparse.Namespace) -> int:
    if args.backtest:
        return cmd_closed_loop_backtest(args.markdown) if args.closed_loop else cmd_backtest(args.markdown)
    if not args.config:
        print("plan needs --config FILE (or --backtest)", file=sys.stderr)
        return 2
    cfg = config_from_args(args)
    gpu = args.gpu or cfg.cluster.gpu
    if cfg.benchmark.closed_loop:
        return cmd_plan_closed_loop(cfg, args, gpu)
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
        batch, about = batch_about(cfg, args.synthetic)
        cluster = f"{cfg.cluster.num_nodes}x{cfg.cluster.gpus_per_node} {gpu}"
        print(f"plan: {cfg.name} ({cfg.layout.describe()}) on {cluster}, {cfg.model.name} {cfg.model.quantization.upper()}")
        print(f"batch: {about}\n")
        verdict = verdict_for(cfg, args.rules)
        if verdict is not None:
            print(verdict.summary() + "\n")
        ok = print_placement(cfg)
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
            print_lent_calibration(cfg, gpu)
            if note := priced_pairing_note(cfg):
                print(f"  {note}")
            if note := same_gpu_kv_note(cfg):
                print(f"  {note}")
            print()
            ok = budget.verdict != INVALID
            band = error_band_of(cfg)
            share = budget.run.eager_share
            print(f"back-test error band of this throughput: {band.text(share) if band else no_band_text(cfg)} "
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
                              jit_cached=not args.jit_cold, band=error_band_of(cfg))
            if not band_printed:  # the config's own layout did not fit: the ranking still gets its band (issue 25)
                band = error_band_of(cfg)
                print(f"back-test error band of the ranked throughputs: {band.text() if band else no_band_text(cfg)} "
                      "(`plan --backtest`)")
    except (PlanError, SimulationError, ValueError) as exc:
        print(f"plan: {exc}", file=sys.stderr)
        return 2
    return 0 if ok else 1



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
    behind = run.behind_model_note()
    if behind:
        print(f"  that run {behind}")
    elif band is not None and abs(error) > band.class_mape(predicted.eager_share):
        print(f"  disagreement: output tok/s {error:+.0%}, outside the back-test's "
              f"±{band.class_mape(predicted.eager_share):.0%} band (this prediction's class)")
    ttft_error = predicted.ttft_p(50) / run_ttft - 1 if run_ttft > 0 else math.nan
    if not behind and abs(ttft_error) > TTFT_DISAGREES:
        print(f"  disagreement: TTFT p50 predicted {predicted.ttft_p(50):.2f} s vs {run_ttft:.2f} s in that run "
              f"({ttft_error:+.0%}; TTFT is not back-tested, so trust the run)")
    print()
