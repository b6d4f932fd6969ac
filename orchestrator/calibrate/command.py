"""Arguments and dispatch of `calibrate {single,pd,twogpu,nixl-patch,parse-log}`.

Used by `python -m orchestrator.calibrate` (stdlib only, on the bare GPU machine) and by
`pd-orchestrator calibrate` (orchestrator/cli/preflight.py registers it).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The four subcommands, on `p` (a top-level parser or the `calibrate` subparser of pd-orchestrator)."""
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("single", help="one model on one server: start-up cold/warm, prefill, decode, knobs")
    s.add_argument("--model-path", required=True)
    s.add_argument("--name", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--budget-s", type=float, required=True, help="wall seconds for everything")
    s.add_argument("--port", type=int, default=30000)
    s.add_argument("--context-length", type=int, default=16384)
    s.add_argument("--knob-mem-fraction", default="0.70")
    s.add_argument("--plan-json", help="a JSON list of variants instead of the default plan")
    s.add_argument("--flag", action="append", default=[], help="extra SGLang flag for every start (repeat)")
    s.add_argument("--dry-run", action="store_true", help="print each server's flags and points; start nothing")

    d = sub.add_parser("pd", help="prefill + decode on this one GPU: KV transfer per page size, logprob check")
    d.add_argument("--model-path", required=True)
    d.add_argument("--out", required=True)
    d.add_argument("--budget-s", type=float, required=True)
    d.add_argument("--page-sizes", default="1")
    d.add_argument("--modes", default="base,coalesce,shard,coalesce+shard",
                   help="sender modes of the NIXL patch, comma-separated (base = SGLang as shipped)")
    d.add_argument("--prefill-frac", type=float, default=0.50)
    d.add_argument("--decode-frac", type=float, default=0.95)
    d.add_argument("--kv-tokens", type=int, default=160000)
    d.add_argument("--requests", type=int, default=96)
    d.add_argument("--loads-per-mode", type=int, default=2)
    d.add_argument("--no-agg", action="store_true", help="skip the aggregated reference server")
    d.add_argument("--prefill-gpu", type=int, default=None, help="--base-gpu-id of the prefill server (default: 0)")
    d.add_argument("--decode-gpu", type=int, default=None, help="--base-gpu-id of the decode server (default: 0)")
    d.add_argument("--flag", action="append", default=[], help="extra SGLang flag for every server (repeat; --flag=--x)")
    d.add_argument("--prefill-flag", action="append", default=[],
                   help="extra SGLang flag for the prefill server only (repeat; --prefill-flag=--disable-overlap-schedule)")

    t = sub.add_parser("twogpu", help="two GPUs of one node: TP2, DP-attention 2 + EP2, PP2 step costs, NCCL "
                       "all-reduce / all-to-all / send times, PP bubble (orchestrator/calibrate/twogpu.py)")
    t.add_argument("--model-path", required=True, help="a model folder with config.json (the R1-shaped one)")
    t.add_argument("--out", required=True)
    t.add_argument("--budget-s", type=float, required=True, help="wall seconds for everything (one device call: <= 600)")
    t.add_argument("--layouts", default="tp2,dpattn2-ep2,pp2", help="comma-separated: tp2, dpattn2-ep2, pp2, tp2-eager (no CUDA graphs), pp2-tail (decode 512 + context)")
    t.add_argument("--collective-tokens", default="1,8,32,64,128,256,512,1024,2048,4096,8192",
                   help="token counts of the collectives (bytes = tokens x hidden x 2)")
    t.add_argument("--no-collectives", action="store_true", help="skip the NCCL micro-benchmark")
    t.add_argument("--port", type=int, default=30000)
    t.add_argument("--flag", action="append", default=[], help="extra SGLang flag for every server (repeat; --flag=--x)")
    t.add_argument("--dry-run", action="store_true", help="print the plan and commands; start nothing")

    n = sub.add_parser("nixl-patch", help="apply the NIXL sender patch and the early KV indices patch "
                       "(early_kv.py) to an installed sglang tree")
    n.add_argument("site_dir")

    lg = sub.add_parser("parse-log", help="start-up phases and decode lines of a server log, as JSON")
    lg.add_argument("log")



def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="calibrate", description="Measure real SGLang on this GPU.")
    add_arguments(p)
    return run(p.parse_args(argv))


def run(a: argparse.Namespace) -> int:
    if a.cmd == "twogpu":
        return _twogpu(a)
    if a.cmd == "single" and a.dry_run:
        from .single import default_plan, describe_plan

        plan = json.loads(Path(a.plan_json).read_text()) if a.plan_json else default_plan(a.knob_mem_fraction)
        print(describe_plan(plan, a.flag, a.context_length))
        return 0
    if a.cmd in ("single", "pd"):
        from orchestrator.provenance import command_line, write_manifest

        write_manifest(Path(a.out), command_line())
    if a.cmd == "single":
        from .single import default_plan, run_single

        plan = json.loads(Path(a.plan_json).read_text()) if a.plan_json else default_plan(a.knob_mem_fraction)
        res = run_single(a.model_path, a.name, Path(a.out), a.budget_s, port=a.port, plan=plan,
                         context_length=a.context_length, common_flags=a.flag)
        _print_summary(res)
    elif a.cmd == "pd":
        from .pd import run_pd

        res = run_pd(a.model_path, Path(a.out), a.budget_s, page_sizes=[int(x) for x in a.page_sizes.split(",")],
                     prefill_frac=a.prefill_frac, decode_frac=a.decode_frac, kv_tokens=a.kv_tokens,
                     n_requests=a.requests, loads_per_mode=a.loads_per_mode, with_agg=not a.no_agg,
                     prefill_gpu=a.prefill_gpu, decode_gpu=a.decode_gpu, extra_flags=a.flag,
                     modes=[m for m in a.modes.split(",") if m], prefill_flags=a.prefill_flag)
        print(json.dumps(res["logprobs"].get("compare"), indent=1))
        for page in res["pages"]:
            print(f"page {page['page_size']} by mode:", json.dumps(page.get("by_mode"), indent=1))
    elif a.cmd == "nixl-patch":
        from . import early_kv, nixl_patch

        paths = nixl_patch.apply(a.site_dir, nixl_patch.PLANS + early_kv.PLANS)
        print("patched " + " ".join(str(p) for p in paths))
    elif a.cmd == "parse-log":
        from . import logparse

        text = Path(a.log).read_text(errors="replace")
        print(json.dumps({"startup": logparse.startup(text), "decode_lines": len(logparse.decode_lines(text))},
                         indent=1))
    return 0


def _print_summary(res: dict) -> None:
    print(f"== {res['name']} on {res['gpu'].get('name')} (sglang {res.get('sglang_version')})")
    for run in res["runs"]:
        d = run.get("derived") or {}
        st = run.get("startup") or {}
        print(f"- {run['variant']}: ready {run.get('ready_after_s')}s; engine {st.get('engine_timings_s')}; "
              f"mem_frac {d.get('mem_fraction_static')} max_running {d.get('effective_max_running_requests_per_dp')} "
              f"graph_max_bs {d.get('cuda_graph_decode_max_bs')} max_total_tokens {d.get('max_total_num_tokens')}"
              + (f"; SKIPPED {run['skipped']}" if run.get("skipped") else "")
              + (f"; ERROR {run['error'][:200]}" if run.get("error") else ""))
        for key in ("decode", "context", "beyond"):
            for r in run.get(key) or []:
                print(f"    {key} B={r.get('batch_size')} C={r.get('context_tokens')}"
                      f"{' (repeat %d)' % r['repeat'] if r.get('repeat') else ''}: {r.get('step_ms_median')} ms "
                      f"graph={r.get('cuda_graph')} wall={(r.get('client') or {}).get('wall_s')}s {r.get('skipped') or ''}")
        for r in run.get("prefill") or []:
            print(f"    prefill k={r.get('concurrency')} L={r.get('input_tokens')}: {r.get('latency_s_median')} s "
                  f"{r.get('skipped') or ''}")


def _twogpu(a: argparse.Namespace) -> int:
    import sys

    from .twogpu import TwoGpuArgsError, check_budget, dry_run, parse_layouts, parse_tokens, run_twogpu

    try:
        layouts, tokens = parse_layouts(a.layouts), parse_tokens(a.collective_tokens)
        check_budget(a.budget_s)
        if not (Path(a.model_path) / "config.json").is_file():
            raise TwoGpuArgsError(f"--model-path {a.model_path}: no config.json there; give the R1-shaped model folder")
    except TwoGpuArgsError as exc:
        print(f"calibrate twogpu: {exc}", file=sys.stderr)
        return 2
    if a.dry_run:
        print(dry_run(a.model_path, Path(a.out), layouts, tokens, a.flag))
        return 0
    from orchestrator.provenance import command_line, write_manifest

    write_manifest(Path(a.out), command_line())
    res = run_twogpu(a.model_path, Path(a.out), a.budget_s, layouts, tokens, collectives=not a.no_collectives,
                     flags=a.flag, port=a.port)
    _print_summary(res)
    return 0
