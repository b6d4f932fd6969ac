"""sims CPU per request: direct dispatcher stream / prefill-nostream / nonstream, alternating, repeated."""
import asyncio, os, sys, time, signal, importlib
sys.path.insert(0, "/tmp/p")
import harness
root = sys.argv[1]; n = int(sys.argv[2]); c = int(sys.argv[3])
pp, dp, boot = harness.free_port(), harness.free_port(), harness.free_port()
procs = [harness.sim(root, "prefill", pp, boot), harness.sim(root, "decode", dp, 8998)]
import orchestrator.pd_dispatch as pdd
from orchestrator.protocol import BenchRequest, WorkerEndpoint
async def nonstream(n, c):
    d = pdd.PDDispatcher(pdd.DispatchSettings())
    d.set_workers([WorkerEndpoint("prefill", "prefill-0", f"http://127.0.0.1:{pp}", "127.0.0.1", boot),
                   WorkerEndpoint("decode", "decode-0", f"http://127.0.0.1:{dp}")])
    sem = asyncio.Semaphore(c)
    async def one():
        async with sem:
            await d.generate({"input_ids": list(range(1, 65)), "sampling_params": {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}}, time.time()+600)
    t = time.perf_counter(); await asyncio.gather(*(one() for _ in range(n))); el = time.perf_counter() - t
    await d.close(); return el
try:
    harness.wait_http(f"http://127.0.0.1:{pp}/health", procs[0]); harness.wait_http(f"http://127.0.0.1:{dp}/health", procs[1])
    for rep in range(3):
        for mode in ("stream", "pf-nostream", "nonstream"):
            pdd.PREFILL_NOSTREAM = mode == "pf-nostream"
            s0 = [harness.cpu(p.pid) for p in procs]; c0 = harness._self_cpu()
            if mode == "nonstream":
                el = asyncio.run(nonstream(n, c))
            else:
                el, lat = asyncio.run(harness.direct(pp, dp, boot, n, c, 4))
            s1 = [harness.cpu(p.pid) for p in procs]; c1 = harness._self_cpu()
            print(f"{mode:12s} {n/el:6.1f} req/s  prefill {(s1[0]-s0[0])/n*1e3:.2f} decode {(s1[1]-s0[1])/n*1e3:.2f} client {(c1-c0)/n*1e3:.2f} ms/req  load {os.getloadavg()[0]:.1f}", flush=True)
finally:
    for p in procs: os.killpg(p.pid, signal.SIGTERM)
