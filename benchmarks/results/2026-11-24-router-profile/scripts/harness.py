"""Ray-free side-by-side: 2 zero-cost sims, our ingress (uvicorn, one process), sglang-router, smg; load; optional py-spy.

usage: harness.py CODE_ROOT --paths ours,rust,smg,openai --conc 32,128 --requests 300 [--spy ours] [--spy-secs 20]
"""
import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import aiohttp

PY = "/work/main/.venv/bin/python"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_http(url, proc, t=60):
    end = time.time() + t
    while time.time() < end:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: process exited {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} not up")


def sim(root, role, port, boot):
    argv = [PY, "-m", "orchestrator.sim.server", "--host", "127.0.0.1", "--port", str(port),
            "--disaggregation-mode", role, "--disaggregation-bootstrap-port", str(boot),
            "--served-model-name", "DeepSeek-R1", "--quantization", "w4a8", "--tp-size", "8", "--dp-size", "1",
            "--ep-size", "1", "--nnodes", "1", "--profile", "cpu-fast", "--time-scale", "0.0001",
            "--efficiency-prefill", "0.45", "--efficiency-decode", "0.6", "--kv-transfer", "auto",
            "--sim-node", f"127.0.0.1/{role}", "--model-preset", "DeepSeek-R1", "--startup-s", "0.0",
            "--model-path", f"{root}/models/deepseek-v2-lite"]
    env = dict(os.environ, PYTHONPATH=root, UCX_NET_DEVICES="lo")
    return subprocess.Popen(argv, env=env, stdout=open(f"/tmp/p/sim-{role}.log", "wb"), stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=root)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--paths", default="ours,rust")
    ap.add_argument("--conc", default="32,128")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--output-len", type=int, default=4)
    ap.add_argument("--spy", default="")
    ap.add_argument("--spy-secs", type=int, default=20)
    ap.add_argument("--ours-cmd", default="", help="argv (space-separated) for our router; {port} {prefill} {decode} {boot}")
    a = ap.parse_args()
    procs = []
    try:
        pp, dp, boot = free_port(), free_port(), free_port()
        procs.append(sim(a.root, "prefill", pp, boot))
        procs.append(sim(a.root, "decode", dp, 8998))
        wait_http(f"http://127.0.0.1:{pp}/health", procs[0])
        wait_http(f"http://127.0.0.1:{dp}/health", procs[1])
        urls = {}
        named = {}
        if any(p.startswith("ours") or p == "openai" for p in a.paths.split(",")):
            port = free_port()
            cmd = (a.ours_cmd or f"{PY} /tmp/p/ours_uvicorn.py {{port}} {{prefill}} {{decode}} {{boot}}").format(
                port=port, prefill=f"http://127.0.0.1:{pp}", decode=f"http://127.0.0.1:{dp}", boot=boot)
            p = subprocess.Popen(cmd.split(), env=dict(os.environ, PYTHONPATH=a.root), cwd=a.root,
                                 stdout=open("/tmp/p/ours.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
            procs.append(p)
            named["ours"] = p
            wait_http(f"http://127.0.0.1:{port}/health", p, 120)
            urls["ours"] = urls["openai"] = f"http://127.0.0.1:{port}"
        if "rust" in a.paths:
            port = free_port()
            p = subprocess.Popen(["/work/main/.venv-router/bin/python", "-m", "sglang_router.launch_router",
                                  "--pd-disaggregation", "--host", "127.0.0.1", "--port", str(port), "--policy",
                                  "round_robin", "--prefill", f"http://127.0.0.1:{pp}", str(boot), "--decode",
                                  f"http://127.0.0.1:{dp}", "--prometheus-host", "127.0.0.1", "--prometheus-port",
                                  str(free_port())],
                                 stdout=open("/tmp/p/rust.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
            procs.append(p)
            named["rust"] = p
            wait_http(f"http://127.0.0.1:{port}/health", p)
            urls["rust"] = f"http://127.0.0.1:{port}"
        if "smg" in a.paths:
            port = free_port()
            p = subprocess.Popen(["/work/main/.venv-router/smg-venv/bin/smg", "launch",
                                  "--pd-disaggregation", "--host", "127.0.0.1", "--port", str(port), "--policy",
                                  "round_robin", "--prefill", f"http://127.0.0.1:{pp}", str(boot), "--decode",
                                  f"http://127.0.0.1:{dp}", "--prometheus-host", "127.0.0.1", "--prometheus-port",
                                  str(free_port())],
                                 stdout=open("/tmp/p/smg.log", "wb"), stderr=subprocess.STDOUT, start_new_session=True)
            procs.append(p)
            named["smg"] = p
            wait_http(f"http://127.0.0.1:{port}/health", p)
            urls["smg"] = f"http://127.0.0.1:{port}"
        rows = []
        for c in [int(x) for x in a.conc.split(",")]:
            for path in a.paths.split(","):
                spy = None
                if a.spy and path == a.spy.split(":")[0]:
                    target = named[a.spy.split(":")[1] if ":" in a.spy else "ours"]
                    spy = subprocess.Popen([PY.replace("python", "py-spy"), "record", "-p", str(target.pid), "-d",
                                            str(a.spy_secs), "-f", "raw", "-o", f"/tmp/p/spy-{path}-{c}.txt", "-r", "200", "--gil"],
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    time.sleep(1)
                cpu0 = {k: cpu(p.pid) for k, p in named.items()}
                cpu0.update(sims=cpu(procs[0].pid) + cpu(procs[1].pid), client=_self_cpu())
                if path == "direct":
                    el, lat = asyncio.run(direct(pp, dp, boot, a.requests, c, a.output_len))
                else:
                    el, lat = asyncio.run(load(urls[path], path, a.requests, c, a.output_len))
                cpu1 = {k: cpu(p.pid) for k, p in named.items()}
                cpu1.update(sims=cpu(procs[0].pid) + cpu(procs[1].pid), client=_self_cpu())
                per = {k: round((cpu1[k] - cpu0[k]) / len(lat) * 1e3, 2) for k in cpu0}
                if spy:
                    spy.wait()
                lat.sort()
                r = dict(path=path, c=c, rps=len(lat) / el, p50=lat[len(lat) // 2] * 1e3,
                         p99=lat[min(len(lat) - 1, int(0.99 * (len(lat) - 1) + 0.5))] * 1e3)
                rows.append(r)
                print(f"{path:8s} c={c:<4d} {r['rps']:7.1f} req/s p50 {r['p50']:7.1f} p99 {r['p99']:7.1f}  cpu ms/req {per}", flush=True)
        print("load", os.getloadavg())
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def cpu(pid):
    """user+sys seconds of a process and its children that were waited for (includes threads)."""
    try:
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _self_cpu():
    t = os.times()
    return t.user + t.system


async def direct(pp, dp, boot, n, c, out_len):
    from orchestrator.pd_dispatch import DispatchSettings, PDDispatcher
    from orchestrator.protocol import BenchRequest, WorkerEndpoint
    d = PDDispatcher(DispatchSettings())
    d.set_workers([WorkerEndpoint("prefill", "prefill-0", f"http://127.0.0.1:{pp}", "127.0.0.1", boot),
                   WorkerEndpoint("decode", "decode-0", f"http://127.0.0.1:{dp}")])
    reqs = [BenchRequest(index=i, input_ids=list(range(1, 65)), output_len=out_len) for i in range(n)]
    lat = []
    t = time.perf_counter()
    async for r in d.run_batch(reqs, c, time.time() + 600):
        assert r.status == "ok", r.error
        lat.append(time.time() - r.sent_at)
    el = time.perf_counter() - t
    await d.close()
    return el, lat


async def load(url, path, n, c, out_len):
    left = [n]
    lat = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=c)) as s:
        async def client():
            while left[0] > 0:
                left[0] -= 1
                if path == "openai":
                    ep, body = "/v1/completions", {"model": "m", "prompt": list(range(1, 65)), "max_tokens": out_len,
                                                   "temperature": 0, "ignore_eos": True}
                else:
                    ep, body = "/generate", {"input_ids": list(range(1, 65)), "sampling_params": {
                        "temperature": 0, "max_new_tokens": out_len, "ignore_eos": True}}
                t0 = time.perf_counter()
                async with s.post(url + ep, json=body) as r:
                    raw = await r.read()
                    assert r.status == 200, raw[:300]
                lat.append(time.perf_counter() - t0)
        t = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(c)))
        return time.perf_counter() - t, lat


if __name__ == "__main__":
    main()
