"""In-process dispatcher (run_batch_chunks) against 2 sims under uvloop: CPU ms/request of this process."""
import asyncio, sys, time, os
sys.path.insert(0, "/tmp/p5"); sys.path.insert(0, os.environ.get("CODE_ROOT", "/work/main"))
import sims, uvloop
from orchestrator.records import BenchRequest, WorkerEndpoint
from orchestrator.router.dispatch import DispatchSettings, PDDispatcher
from orchestrator.router.batch import run_batch_chunks
n = int(sys.argv[1]); c = int(sys.argv[2]); rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
pp, dp, boot, procs = sims.start()
async def one_round(d, n):
    reqs = [BenchRequest(index=i, input_ids=list(range(1, 65)), output_len=4) for i in range(n)]
    k = 0
    async for chunk in run_batch_chunks(d, reqs, c, time.time() + 600, flush_s=0.05):
        for r in chunk:
            assert r.status == "ok", r.error
            k += 1
    assert k == n
async def main():
    metrics = None
    if os.environ.get("METRICS"):
        from orchestrator.observe.metrics import RouterMetrics
        metrics = RouterMetrics("run", "1p1d")
    d = PDDispatcher(DispatchSettings(), metrics=metrics)
    eps = [WorkerEndpoint(role="prefill", name="prefill-0", url=f"http://127.0.0.1:{pp}", bootstrap_port=boot, node_ip="127.0.0.1"),
                   WorkerEndpoint(role="decode", name="decode-0", url=f"http://127.0.0.1:{dp}", node_ip="127.0.0.1")]
    d.set_workers(eps)
    if metrics:
        for e in eps: metrics.add_worker(e.role, e.name)
    await one_round(d, 64)
    out = []
    for _ in range(rounds):
        c0, s0, t0 = sims.self_cpu(), sum(sims.cpu(p.pid) for p in procs), time.perf_counter()
        await one_round(d, n)
        el = time.perf_counter() - t0
        out.append(((sims.self_cpu() - c0) / n * 1e3, (sum(sims.cpu(p.pid) for p in procs) - s0) / n * 1e3, n / el))
    await d.close()
    return out
try:
    res = uvloop.run(main())
    for r in res: print(f"router cpu ms/req {r[0]:.3f}  engines {r[1]:.2f}  {r[2]:.0f} req/s")
    xs = sorted(x[0] for x in res); print(f"router cpu ms/req median {xs[len(xs)//2]:.3f} min {xs[0]:.3f} load {os.getloadavg()[0]:.1f}")
finally:
    sims.stop(procs)
