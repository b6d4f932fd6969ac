"""Scratch harness (U1), current tree: the 2 sim servers of configs/default.yaml + in-process dispatcher, no Ray."""
import asyncio, glob, json, os, sys, time
from pathlib import Path
from orchestrator.config import load_config
from orchestrator.engines.sim.backend import SimBackend
from orchestrator.engines.base import WorkerPlacement, EngineProcess
from orchestrator.router.dispatch import PDDispatcher, DispatchSettings
from orchestrator.router.batch import run_batch
from orchestrator.records import WorkerEndpoint
from orchestrator.workload.batch import sample_batch
from orchestrator.run.bench import max_in_flight
from orchestrator.run.fidelity import modelled_run, engine_pacing
from orchestrator.cluster.ports import free_port

cfg = load_config("configs/default.yaml", ["engine.sim.startup_s=0.5", *sys.argv[1:]])
procs, eps = [], []
for role, i, group in cfg.layout.groups():
    port = free_port("127.0.0.1"); bport = free_port("127.0.0.1") if role == "prefill" else None
    pl = WorkerPlacement(role=role, group_index=i, replica_index=0, host="127.0.0.1", advertise_host="127.0.0.1",
                         port=port, bootstrap_port=bport, node_ip="127.0.0.1")
    launch = SimBackend().build_launch(cfg, group, pl)
    ep = EngineProcess(launch, Path(f"/tmp/u1/{role}2.log")); ep.start(); procs.append(ep)
    eps.append(WorkerEndpoint(name=f"{role}-{i}/0", role=role, url=launch.url, bootstrap_host="127.0.0.1" if bport else None,
                              bootstrap_port=bport, node_ip="127.0.0.1"))
try:
    for p in procs: p.wait_healthy(60)
    reqs = sample_batch(cfg, cfg.benchmark.num_prompts)
    lim = max_in_flight(cfg, len(reqs))
    model = modelled_run(cfg, [(r.prompt_len, r.output_len) for r in reqs], lim)
    async def go():
        d = PDDispatcher(DispatchSettings(), "pd"); d.set_workers(eps)
        t = time.perf_counter(); res = []
        async for r in run_batch(d, reqs, lim):
            res.append(r)
        dt = time.perf_counter() - t
        await d.close()
        return dt, res
    dt, res = asyncio.run(go())
    ok = [r for r in res if r.status == "ok"]
    ttft = sorted(r.ttft_s for r in ok if r.ttft_s is not None)
    print(json.dumps(dict(limit=lim, measured_s=round(dt, 2), modelled_s=round(model.duration_s, 2), ratio=round(dt / model.duration_s, 3),
        ok=len(ok), ttft_p50=ttft[len(ttft)//2], model_ttft_p50=model.ttft_p(50), load=os.getloadavg())))
    print(json.dumps(engine_pacing(eps)))
finally:
    for p in procs: p.stop()
