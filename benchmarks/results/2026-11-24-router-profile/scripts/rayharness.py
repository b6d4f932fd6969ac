"""Ray path CPU per request: proxy, router replica, sims, driver, rust; optional py-spy of a process."""
import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(sys.argv[1])
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.argv.pop(1)
import router_throughput as paths  # noqa

sys.path.insert(0, "/tmp/p")
from harness import cpu, _self_cpu  # noqa


def pids(pattern):
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def run_chunks(router, reqs, c):
    lat = []
    start = time.perf_counter()
    for chunk in router.options(stream=True).generate_batch_chunks.remote(reqs, c, time.time() + 600):
        for r in chunk:
            assert r.status == "ok", r.error
            lat.append(time.time() - r.sent_at)
    return time.perf_counter() - start, lat


async def run_openai(url, reqs, c):
    import aiohttp
    queue = list(reqs)
    lat = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=c)) as session:
        async def client():
            while queue:
                req = queue.pop()
                body = {"model": "m", "prompt": req.input_ids, "max_tokens": req.output_len, "temperature": 0,
                        "ignore_eos": True}
                t0 = time.time()
                async with session.post(url + "/v1/completions", json=body) as resp:
                    await resp.read()
                    assert resp.status == 200, await resp.text()
                lat.append(time.time() - t0)
        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(c)))
        return time.perf_counter() - start, lat


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--paths", default="rust,handle,http")
    ap.add_argument("--conc", default="32,128")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--spy", default="")  # path:proc e.g. http:proxy
    a = ap.parse_args()
    os.environ["PYTHONPATH"] = str(ROOT)
    with paths.deployed_router("router-prof", "/work/main/.venv-router/bin/python") as bench:
        sims = [p for p in pids("orchestrator.sim.server") if b"0.0001" in open(f"/proc/{p}/cmdline", "rb").read()
                and str(ROOT).encode() in open(f"/proc/{p}/environ", "rb").read()]
        procs = {"replica": pids("ServeReplica:pd-router"), "proxy": pids("ray::ProxyActor"), "sims": sims,
                 "rust": pids("sglang_router.launch_router")}
        print("procs", procs, flush=True)
        for c in [int(x) for x in a.conc.split(",")]:
            for path in a.paths.split(","):
                reqs = paths.make_requests(a.requests, 4)
                spy = None
                if a.spy and a.spy.split(":")[0] == path:
                    who = a.spy.split(":")[1]
                    pid = os.getpid() if who == "driver" else procs[who][0]
                    spy = subprocess.Popen(["/work/main/.venv/bin/py-spy", "record", "-p", str(pid), "-d", "10",
                                            "-f", "raw", "-o", f"/tmp/p/rayspy-{path}-{who}-{c}.txt", "-r", "100",
                                            "--gil"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    time.sleep(1)
                c0 = {k: sum(cpu(p) for p in v) for k, v in procs.items()}
                c0["driver"] = _self_cpu()
                if path == "handle":
                    el, lat = paths.run_handle(bench.router, reqs, c)
                elif path == "chunks":
                    el, lat = run_chunks(bench.router, reqs, c)
                elif path == "openai":
                    el, lat = asyncio.run(run_openai(bench.urls["http"], reqs, c))
                else:
                    el, lat = asyncio.run(paths.run_http(bench.urls[path], reqs, c))
                c1 = {k: sum(cpu(p) for p in v) for k, v in procs.items()}
                c1["driver"] = _self_cpu()
                if spy:
                    spy.wait()
                per = {k: round((c1[k] - c0[k]) / len(lat) * 1e3, 2) for k in c0}
                print(f"{path:7s} c={c:<4d} {len(lat) / el:7.1f} req/s p50 {paths.percentile(lat, 50) * 1e3:7.1f} "
                      f"p99 {paths.percentile(lat, 99) * 1e3:7.1f} cpu ms/req {per}", flush=True)
    print("load", os.getloadavg())


if __name__ == "__main__":
    main()
