"""The opening of a 1000-request batch through the product's router, two source trees interleaved, against a direct
client: when each request reached the engine, when its first token and its answer reached the client.

    .venv/bin/python benchmarks/router_burst.py --before ../before-tree [--mode aggregated|pd] [--requests 1000] \\
        [--rounds 3] [--step-s 0.02] --out benchmarks/results/<date>-router-burst

Each round runs every tree once (`--before`, then this one; the order alternates between rounds), each in a process of
its own (`--one TREE`) that imports that tree and brings the product up as `bench` does: a local 2-node Ray cluster,
Serve, the router application (PDRouter, checked to run the tree's code); its registry is given `stamp_server.py`
engines (aggregated: one; pd: a prefill and a decode) by hand. Then bench's warm-up batch and, right after it, the
run's batch (the embedded default's ShareGPT sample, every prompt's first id made its index so the server can name
it) go through `run.driver.stream_batch` on the router handle with every request in flight, as bench sends them.
Last, `direct`: the same batch from one aiohttp client, all requests at once, streamed, straight to the same engine.

The engines stamp each request's arrival and when they wrote its first and last event (time.time(), same machine),
so per run: arrivals at the engine (0 = the batch's first send), the client's first tokens, and how far the client's
first tokens and answers lag what the engine wrote (the answers "behind": engine-finished minus client-finished
requests, its maximum over the run). Prints one line per run and a markdown table of the medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if "--one" not in sys.argv:  # a run imports the tree it is given instead (main() puts it first)
    sys.path.insert(0, str(ROOT))


# ---- one run: in its own process, importing TREE -------------------------------------------------------------------


def _start_engines(mode: str, step_s: float) -> tuple[list[subprocess.Popen], dict[str, str]]:
    from orchestrator.cluster.ports import free_port

    roles = ["aggregated"] if mode == "aggregated" else ["prefill", "decode"]
    procs, urls = [], {}
    for role in roles:
        port = free_port()
        argv = [sys.executable, str(HERE / "stamp_server.py"), "--port", str(port), "--step-s", str(step_s)]
        procs.append(subprocess.Popen(argv + (["--prefill"] if role == "prefill" else [])))
        urls[role] = f"http://127.0.0.1:{port}"
    return procs, urls


def _stamps(url: str) -> list[list]:
    import urllib.request

    with urllib.request.urlopen(url + "/stamps", timeout=30) as r:
        return json.loads(r.read())


def _wait_up(url: str) -> None:
    import urllib.request

    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _keyed(requests: list) -> list:
    """The batch with each prompt's first id replaced by its index, so the engine can name the request."""
    from orchestrator.records import BenchRequest

    return [BenchRequest(index=i, input_ids=[i, *r.input_ids[1:]], output_len=r.output_len)
            for i, r in enumerate(requests)]


def _summary(path: str, t0: float, rows: list[list], first: dict[int, float], done: dict[int, float]) -> dict:
    """Arrivals and lags of one run from the engine's stamps and the client's times (all time.time())."""
    arrived = sorted(r[1] - t0 for r in rows)
    wrote_first = {r[0]: r[2] for r in rows}
    wrote_last = {r[0]: r[3] for r in rows}
    first_lag = sorted(first[k] - wrote_first[k] for k in first if wrote_first.get(k) is not None)
    answer_lag = sorted(done[k] - wrote_last[k] for k in done if wrote_last.get(k) is not None)
    events = sorted([(t, 1) for t in wrote_last.values() if t is not None] + [(t, -1) for t in done.values()])
    behind = most_behind = 0
    for _, step in events:
        behind += step
        most_behind = max(most_behind, behind)
    firsts = sorted(t - t0 for t in first.values())

    def q(values: list[float], p: float) -> float:
        return values[min(len(values) - 1, int(p * len(values)))]

    return {
        "path": path, "requests": len(rows), "answered": len(done),
        "arrived_by_50ms": sum(1 for a in arrived if a <= 0.05), "arrived_by_500ms": sum(1 for a in arrived if a <= 0.5),
        "first_arrival_s": arrived[0], "arrival_p50_s": q(arrived, 0.5), "arrival_p99_s": q(arrived, 0.99),
        "last_arrival_s": arrived[-1],
        "client_first_token_first_s": firsts[0], "client_first_token_p50_s": q(firsts, 0.5),
        "first_token_lag_p50_s": q(first_lag, 0.5), "first_token_lag_p99_s": q(first_lag, 0.99),
        "first_token_lag_max_s": first_lag[-1],
        "answer_lag_p50_s": q(answer_lag, 0.5), "answer_lag_p99_s": q(answer_lag, 0.99),
        "answer_lag_max_s": answer_lag[-1], "answers_behind_max": most_behind,
        "last_answer_s": max(done.values()) - t0,
    }


async def _direct(url: str, requests: list) -> tuple[float, dict[int, float], dict[int, float]]:
    import asyncio

    import aiohttp

    first: dict[int, float] = {}
    done: dict[int, float] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(req) -> None:
            body = {"input_ids": req.input_ids, "stream": True, "sampling_params": {
                "temperature": 0, "max_new_tokens": req.output_len, "ignore_eos": True}}
            async with session.post(url + "/generate", json=body) as resp:
                async for _ in resp.content.iter_any():
                    first.setdefault(req.index, time.time())
            done[req.index] = time.time()

        t0 = time.time()
        await asyncio.gather(*(one(r) for r in requests))
    return t0, first, done


def run_one(tree: Path, mode: str, n: int, step_s: float, label: str, profile: Path | None = None) -> list[dict]:
    """Product path then direct client, in this process (which imported `tree`); one summary per path. `profile`: a
    py-spy record (raw, 200 Hz, the batch's first 2 s) of the router replica goes to this file."""
    import asyncio

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    import ray
    from ray import serve
    from ray.serve.api import RunTarget

    from deployments.app import ROUTER_APP, build_app, run_targets, start_serve
    from orchestrator.cluster.connect import connect
    from orchestrator.cluster.ports import free_port
    from orchestrator.cluster.registry import get_registry
    from orchestrator.config import load_config
    from orchestrator.records import WorkerEndpoint
    from orchestrator.run.driver import stream_batch
    from orchestrator.workload.batch import sample_batch, warmup_batch

    tmp = tempfile.mkdtemp(prefix="router-burst-")
    overrides = [f"router.port={free_port()}", "metrics.exporter_port=0", f"benchmark.result_dir={tmp}",
                 f"benchmark.num_prompts={n}"]
    if mode == "aggregated":
        overrides.append("layout={mode: aggregated, aggregated: [{count: 1, tp: 8}]}")
    cfg = load_config(ROOT / "configs" / "default.yaml", overrides)
    requests = _keyed(sample_batch(cfg, n))
    warmup = _keyed(warmup_batch(cfg, n))
    for r in warmup:
        r.input_ids[0] = n + r.index  # keys apart from the run's
    procs, urls = _start_engines(mode, step_s)
    session = connect(cfg, Path(tmp) / "cluster.json")
    try:
        for url in urls.values():
            _wait_up(url)
        start_serve(cfg)
        run_targets([RunTarget(target=build_app(cfg, "router-burst"), name=ROUTER_APP, route_prefix=None)], 300)
        registry = get_registry()
        for role, url in urls.items():
            endpoint = WorkerEndpoint(role=role, name=f"{role}/0", url=url,  # type: ignore[arg-type]  # a Role
                                      bootstrap_port=1 if role == "prefill" else None)
            ray.get(registry.register.remote(endpoint))
        router = serve.get_app_handle(ROUTER_APP)
        expected = {role: 1 for role in urls}
        router.wait_ready.remote(expected, 60).result(timeout_s=90)

        @ray.remote(num_cpus=0)
        def imported_from() -> str:
            import orchestrator.router.batch as batch

            return batch.__file__

        where = ray.get(imported_from.remote())
        if not where.startswith(str(tree)):
            raise SystemExit(f"the cluster imported {where}, not tree {tree}")
        engine = urls.get("decode") or urls["aggregated"]
        stream_batch(router, warmup, len(warmup), time.time() + 600)  # as bench: warm-up, then at once the run
        for url in urls.values():
            _stamps(url)
        spy = None
        if profile is not None:
            pid = router.process_id.remote().result(timeout_s=30)
            spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(pid), "-r", "200",
                                    "-d", "2", "-f", "raw", "--nonblocking", "-o", str(profile)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)  # py-spy attached and sampling before the first send
        called = time.time()
        results = stream_batch(router, requests, len(requests), time.time() + 600)
        if spy is not None:
            spy.wait(timeout=60)
        failed = [r for r in results if r.status != "ok"]
        if failed:
            raise SystemExit(f"{len(failed)} requests failed through the router, first: {failed[0].error}")
        t0 = min(r.sent_at or 0.0 for r in results)
        first = {r.index: (r.sent_at or 0.0) + (r.ttft_s or 0.0) for r in results}
        done = {r.index: r.done_at or 0.0 for r in results}
        product = _summary(label, t0, _stamps(engine), first, done)
        product["call_to_first_send_s"] = t0 - called
        if mode == "pd":
            product["prefill_arrival_p99_s"] = _summary(label, t0, _stamps(urls["prefill"]), first, done)["arrival_p99_s"]
        time.sleep(5)  # the engines' last answers are out; the direct client starts on an idle engine
        t0, first, done = asyncio.run(_direct(engine, requests))
        direct = _summary("direct", t0, _stamps(engine), first, done)
        return [product, direct]
    finally:
        for proc in procs:
            proc.terminate()
        serve.shutdown()
        session.close()


# ---- the rounds --------------------------------------------------------------------------------------------------

COLUMNS = [
    ("arrived_by_50ms", "arrived by +50 ms", "{:.0f}"), ("first_arrival_s", "first arrival s", "{:.3f}"),
    ("arrival_p50_s", "arrival p50 s", "{:.3f}"), ("arrival_p99_s", "arrival p99 s", "{:.3f}"),
    ("client_first_token_p50_s", "client 1st token p50 s", "{:.3f}"),
    ("first_token_lag_p99_s", "1st-token lag p99 s", "{:.3f}"), ("answer_lag_p99_s", "answer lag p99 s", "{:.3f}"),
    ("answers_behind_max", "answers behind, max", "{:.0f}"), ("last_answer_s", "last answer s", "{:.2f}"),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="the other source tree (e.g. `git archive` of main before a change)")
    parser.add_argument("--mode", choices=("aggregated", "pd"), default="aggregated")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--step-s", type=float, default=0.02, help="the stamp engines' decode step")
    parser.add_argument("--out", type=Path, default=None, help="results folder: manifest.json, output.txt, result.json")
    parser.add_argument("--profile", action="store_true",
                        help="py-spy the router replica over each batch's first 2 s: --out/<tree>-round<k>.raw")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # internal: one run importing this tree
    parser.add_argument("--label", default="", help=argparse.SUPPRESS)
    parser.add_argument("--profile-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.requests < 1 or args.rounds < 1 or args.step_s <= 0:
        raise SystemExit("--requests and --rounds must be >= 1 and --step-s > 0")
    if args.profile and args.out is None:
        raise SystemExit("--profile writes its py-spy files into --out: give --out DIR")
    if args.one is not None:
        tree = args.one.resolve()
        sys.path.insert(0, str(tree))
        print(json.dumps(run_one(tree, args.mode, args.requests, args.step_s, args.label, args.profile_file)))
        return 0
    if args.before is None or not (args.before / "orchestrator" / "router" / "batch.py").is_file():
        raise SystemExit("--before must name a source tree of this repo (it has orchestrator/router/batch.py), e.g. "
                         "`mkdir ../before && git archive <commit> | tar -x -C ../before`")
    from orchestrator.provenance import recorded

    trees = {"before": args.before.resolve(), "after": ROOT}
    with recorded(args.out):
        runs: list[dict] = []
        print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start; {args.mode}, "
              f"{args.requests} requests, stamp engines' step {args.step_s} s; trees {trees}", flush=True)
        for k in range(args.rounds):
            order = ["before", "after"] if k % 2 == 0 else ["after", "before"]
            for label in order:
                argv = [sys.executable, str(Path(__file__).resolve()), "--one", str(trees[label]), "--label", label,
                        "--mode", args.mode, "--requests", str(args.requests), "--step-s", str(args.step_s)]
                if args.profile and args.out is not None:
                    argv += ["--profile-file", str((args.out / f"{label}-round{k + 1}.raw").resolve())]
                # PYTHONPATH: the local cluster's raylets and so the router replica import the tree too
                env = {**os.environ, "PYTHONPATH": str(trees[label])}
                out = subprocess.run(argv, cwd=trees[label], env=env, capture_output=True, text=True)
                if out.returncode != 0:
                    sys.stderr.write(out.stderr[-4000:])
                    raise SystemExit(f"round {k + 1} {label}: exit {out.returncode}")
                for row in json.loads(out.stdout.strip().splitlines()[-1]):
                    row["round"] = k + 1
                    row["tree"] = label
                    runs.append(row)
                    print(json.dumps(row), flush=True)
        print(f"\nload average {os.getloadavg()[0]:.1f} at the end; medians over {args.rounds} rounds "
              f"(direct: the aiohttp client in each tree's process)\n")
        print("| path | " + " | ".join(title for _, title, _ in COLUMNS) + " |")
        print("|---|" + "---|" * len(COLUMNS))
        for path in ("before", "after"):
            for kind in (path, "direct"):
                rows = [r for r in runs if r["tree"] == path and r["path"] == kind]
                name = f"{path} (router)" if kind == path else f"direct, beside {path}"
                print(f"| {name} | " + " | ".join(fmt.format(statistics.median(r[key] for r in rows))
                                                  for key, _, fmt in COLUMNS) + " |")
        if args.out is not None:
            (args.out / "result.json").write_text(json.dumps(runs, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
