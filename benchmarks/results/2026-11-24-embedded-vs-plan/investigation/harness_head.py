"""Scratch harness (U1): default config's prefill+decode sim servers + in-process PDDispatcher, no Ray."""
import asyncio, os, subprocess, sys, time, json
from pathlib import Path
from orchestrator.config import load_config
from orchestrator.engines.sim import SimBackend
from orchestrator.engines.base import WorkerPlacement, EngineProcess
from orchestrator.pd_dispatch import PDDispatcher, DispatchSettings
from orchestrator.protocol import WorkerEndpoint
from orchestrator.bench import sample_batch, max_in_flight
from orchestrator.ports import free_port

sets = sys.argv[1:]
cfg = load_config("configs/default.yaml", ["engine.sim.startup_s=0.5", *sets])
n = cfg.benchmark.num_prompts
procs, eps = [], []
extra = os.environ.get("U1_EXTRA", "").split()
for role, i, group in cfg.layout.groups():
    port = free_port("127.0.0.1"); bport = free_port("127.0.0.1") if role == "prefill" else None
    pl = WorkerPlacement(role=role, group_index=i, replica_index=0, host="127.0.0.1", advertise_host="127.0.0.1",
                         port=port, bootstrap_port=bport, node_ip="127.0.0.1")
    launch = SimBackend().build_launch(cfg, group, pl)
    launch.argv += extra
    ep = EngineProcess(launch, Path(f"/tmp/u1/{role}.log")); ep.start(); procs.append(ep)
    eps.append(WorkerEndpoint(name=f"{role}-{i}/0", role=role, url=launch.url, bootstrap_host="127.0.0.1" if bport else None, bootstrap_port=bport,
                              node_ip="127.0.0.1"))
    print(role, ep.proc.pid, launch.argv[3:], flush=True)
try:
    for p in procs: p.wait_healthy(60)
    reqs = sample_batch(cfg, n)
    lim = max_in_flight(cfg, len(reqs))
    async def go():
        d = PDDispatcher(DispatchSettings(), "pd")
        d.set_workers(eps)
        t = time.perf_counter(); ok = 0; out = 0; inp = 0
        async for r in d.run_batch(reqs, lim):
            if r.status == "ok": ok += 1; out += r.completion_tokens or 0; inp += r.prompt_len
            else: print("FAIL", r.error)
        dt = time.perf_counter() - t
        await d.close()
        return dt, ok, inp, out
    dt, ok, inp, out = asyncio.run(go())
    print(json.dumps(dict(n=n, limit=lim, duration_s=round(dt, 2), ok=ok, input_tokens=inp, output_tokens=out,
                          out_tps=round(out / dt), total_tps=round((inp + out) / dt), load=os.getloadavg(), harness_cpu_s=round(sum(os.times()[:2]), 1))))
finally:
    for p in procs:
        try:
            import glob
            th = {}
            for t in glob.glob(f"/proc/{p.proc.pid}/task/*/stat"):
                f = open(t).read().rsplit(")", 1)[1].split()
                th[t.split("/")[4]] = (int(f[11]) + int(f[12])) / 100
            print(p.launch.argv[8], "cpu_s total", round(sum(th.values()), 1), "threads", sorted(th.values(), reverse=True)[:3])
        except Exception as e: print(e)
        p.stop()
