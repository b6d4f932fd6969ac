"""`pd-orchestrator prepare --config X`: what may legitimately be done before the timed run, done before it.

config -> checks (memory fit, rules profile; nothing downloaded) -> every node of the cluster, by a Ray task
pinned to it: tokenizer loaded, dataset read and the run's batch + warm-up batch sampled into the node's cache,
and for real SGLang: the interpreter, SGLang's version, the model's config.json without downloading, the
compile-cache directory -> compile caches: real SGLang engines start once with the run's exact flags and
`engine.sglang.compile_cache_dir` (Triton, DeepGEMM, FlashInfer, CUDA caches), take the warm-up batch, and
stop; each worker then records its shape as warm on its node (orchestrator/engines/sglang/caches.py). The
simulated engine has no compile caches: that step is a no-op that says so.

A later `bench` of the same config finds the dataset sampled and, for SGLang, starts with warm caches (it
records cold/warm per engine). Every step reports what it found; `ok` is False when a step failed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from orchestrator.config import RunConfig

COMPILE_TIMEOUT_S = 3600.0  # a cold DeepGEMM precompile of R1 alone can take ~10 minutes per SGLang's docs
# config.json of the model, looked up in the engine's interpreter without downloading anything
_MODEL_CONFIG_PROBE = r"""
import json, sys
from importlib import metadata
out = {"sglang_version": None, "model_config": None}
try:
    out["sglang_version"] = metadata.version("sglang")
except metadata.PackageNotFoundError:
    pass
path = sys.argv[1]
import os
if os.path.isdir(path):
    p = os.path.join(path, "config.json")
    out["model_config"] = p if os.path.isfile(p) else None
else:
    try:
        from huggingface_hub import try_to_load_from_cache
        p = try_to_load_from_cache(path, "config.json")
        out["model_config"] = p if isinstance(p, str) else None
    except Exception:
        pass
print(json.dumps(out))
"""


@dataclass
class Check:
    """One named check: ok, and one line saying what was found (or the fix)."""

    name: str
    ok: bool
    detail: str
    note: bool = False  # information only (e.g. a rules verdict): never makes prepare fail

    def line(self) -> str:
        mark = "note" if self.note else "ok  " if self.ok else "FAIL"
        return f"  {mark} {self.name}: " + self.detail.replace("\n", "\n         ")


@dataclass
class NodeReport:
    """What one node has in place after its prepare task ran there."""

    node_id: str
    ip: str
    roles: list[str]
    hostname: str = ""
    checks: list[Check] = field(default_factory=list)
    batch_fingerprint: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


@dataclass
class PrepareReport:
    config_name: str
    layout: str
    engine: str
    checks: list[Check] = field(default_factory=list)
    nodes: list[NodeReport] = field(default_factory=list)
    compile: list[Check] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        same_batch = len({n.batch_fingerprint for n in self.nodes}) <= 1
        return (all(c.ok for c in self.checks) and all(n.ok for n in self.nodes) and same_batch
                and all(c.ok for c in self.compile))

    def text(self) -> str:
        lines = [f"prepare: {self.config_name} ({self.layout}), engine {self.engine}"]
        lines.extend(c.line() for c in self.checks)
        for n in self.nodes:
            lines.append(f"node {n.ip} ({n.hostname}; {', '.join(n.roles) or 'no role'}), {n.seconds:.1f} s:")
            lines.extend(c.line() for c in n.checks)
        if len({n.batch_fingerprint for n in self.nodes}) > 1:
            lines.append("  FAIL nodes sampled different batches: " +
                         ", ".join(f"{n.ip} {n.batch_fingerprint}" for n in self.nodes) +
                         "; give every node the same dataset file (benchmark.dataset_path) and tokenizer")
        lines.append("compile caches:")
        lines.extend(c.line() for c in self.compile)
        lines.append(f"{'prepared' if self.ok else 'NOT prepared'} in {self.seconds:.1f} s")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


# ---- checks that need no cluster ----------------------------------------------------------------------


def config_checks(cfg: RunConfig) -> list[Check]:
    """Memory fit (what `bench` refuses to launch) and the rules profile, if the config names one."""
    from orchestrator.plan.memory.preflight import check_layout_fits

    memory = check_layout_fits(cfg, suggest=False)
    checks = [Check("memory", memory.fits, memory.summary().splitlines()[0].removeprefix("memory: "))]
    if cfg.rules:
        from orchestrator.rules import check_config, load_profile

        verdict = check_config(cfg, load_profile(cfg.rules))
        # a rules verdict is information: the default preset is knowingly not compliant
        checks.append(Check("rules", True, verdict.summary(), note=True))
    return checks


# ---- what runs on every node --------------------------------------------------------------------------


def batch_fingerprint(lengths: list[tuple[int, int]]) -> str:
    return hashlib.sha256(json.dumps(lengths).encode()).hexdigest()[:12]


def prepare_this_node(cfg: RunConfig) -> tuple[list[Check], str | None]:
    """Tokenizer, dataset and the run's batches in place on the node this runs on; SGLang's prerequisites."""
    from orchestrator.workload.batch import sample_batch, warmup_batch
    from orchestrator.workload.sharegpt_file import dataset_file
    from orchestrator.workload.tokenizer import load_tokenizer

    checks: list[Check] = []
    fingerprint = None
    try:
        tok = load_tokenizer(cfg.model.path)
        checks.append(Check("tokenizer", True, f"{tok.origin} (fingerprint {tok.fingerprint})"))
    except Exception as exc:
        checks.append(Check("tokenizer", False, str(exc)))
    try:
        with dataset_file(cfg.benchmark.dataset_path) as path:
            where = str(path)
        batch = sample_batch(cfg, cfg.benchmark.num_prompts)
        warm = warmup_batch(cfg, len(batch))
        lengths = [(r.prompt_len, r.output_len) for r in batch]
        fingerprint = batch_fingerprint(lengths)
        checks.append(Check(
            "dataset", True,
            f"{where}: {len(batch)} prompts sampled (seed {cfg.benchmark.seed}), "
            f"{sum(p for p, _ in lengths):,} input + {sum(o for _, o in lengths):,} output tokens, "
            f"batch {fingerprint}; warm-up {len(warm)} prompts",
        ))
    except Exception as exc:
        checks.append(Check("dataset", False, f"{type(exc).__name__}: {exc}"))
    if not cfg.simulated:  # real SGLang: its interpreter, the model files, the cache dir
        checks.extend(_sglang_node_checks(cfg))
    return checks, fingerprint


def _sglang_node_checks(cfg: RunConfig) -> list[Check]:
    from orchestrator.engines.sglang.caches import cache_dir
    from orchestrator.engines.sglang.launch import model_path

    eng = cfg.engine.sglang
    checks: list[Check] = []
    python = shutil.which(eng.python) or (eng.python if Path(eng.python).is_file() else None)
    if python is None:
        return [Check("sglang", False, f"engine.sglang.python={eng.python!r} is not on this node; install SGLang "
                                       "there or set engine.sglang.python to its interpreter")]
    try:
        model = model_path(cfg)
        out = subprocess.run([python, "-c", _MODEL_CONFIG_PROBE, model], capture_output=True, text=True, timeout=120)
        probe = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {}
    except (ValueError, IndexError, OSError, subprocess.TimeoutExpired) as exc:
        probe, model = {}, str(exc)
    version = probe.get("sglang_version")
    checks.append(Check("sglang", version is not None,
                        f"SGLang {version} in {python}" if version else
                        f"{python} cannot import sglang; install it (pip install 'sglang[all]==0.5.17')"))
    found = probe.get("model_config")
    checks.append(Check("model", found is not None,
                        f"config.json at {found}" if found else
                        f"{model}: no config.json on this node (not downloaded by prepare); copy the model "
                        "directory there and set model.path, or fetch it once with huggingface-cli download"))
    root = cache_dir(eng.compile_cache_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe_file = root / f".write-test-{uuid.uuid4().hex[:6]}"
        probe_file.write_text("ok")
        probe_file.unlink()
        checks.append(Check("compile cache dir", True, f"{root} writable"))
    except OSError as exc:
        checks.append(Check("compile cache dir", False, f"{root}: {exc}; set engine.sglang.compile_cache_dir "
                                                        "to a writable persistent directory"))
    return checks


def _node_task(cfg: RunConfig) -> dict:
    started = time.monotonic()
    checks, fingerprint = prepare_this_node(cfg)
    return {"hostname": socket.gethostname(), "checks": [asdict(c) for c in checks],
            "fingerprint": fingerprint, "seconds": time.monotonic() - started}


def prepare_nodes(cfg: RunConfig) -> list[NodeReport]:
    """Run the node step on every alive node of the connected cluster, each pinned to its node."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from orchestrator.cluster.inventory import node_inventory

    task = ray.remote(num_cpus=0)(_node_task)
    nodes = node_inventory()
    role_key = cfg.cluster.roles.label_key
    refs = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False)).remote(cfg)
            for n in nodes]
    reports = []
    for n, out in zip(nodes, ray.get(refs)):
        role = n.labels.get(role_key)
        reports.append(NodeReport(
            node_id=n.node_id, ip=n.ip, roles=[role] if role else [], hostname=out["hostname"],
            checks=[Check(**c) for c in out["checks"]], batch_fingerprint=out["fingerprint"],
            seconds=out["seconds"],
        ))
    return reports


# ---- compile caches -----------------------------------------------------------------------------------


def build_compile_caches(cfg: RunConfig, state_path: Path | None = None) -> list[Check]:
    """Start every engine once with the run's flags, send the warm-up batch, stop: caches hold its shapes.

    The simulated engine compiles nothing; its start-up is modelled with warm caches.
    """
    if cfg.simulated:
        return [Check("sim engine", True, "no JIT/compile caches to build (nothing done); the simulated start-up "
                                          "is modelled with warm caches")]
    from orchestrator.plan.closedloop.startup_budget import engine_ready_timeout
    from orchestrator.run.bench import max_in_flight
    from orchestrator.run.deployment import Deployment, with_free_router_port
    from orchestrator.run.bench_warmup import run_warmup
    from orchestrator.workload.batch import sample_batch, warmup_batch

    cfg = with_free_router_port(cfg)
    timeout_s = max(COMPILE_TIMEOUT_S, engine_ready_timeout(cfg).seconds)
    deadline_at = time.time() + timeout_s
    warm = warmup_batch(cfg, cfg.benchmark.num_prompts) or sample_batch(cfg, 16)
    checks: list[Check] = []
    with Deployment(cfg, f"{cfg.name}-prepare-{uuid.uuid4().hex[:6]}", deadline_at, state_path) as deployment:
        started = time.monotonic()
        deployment.place()
        endpoints = deployment.wait_ready()
        ready_s = time.monotonic() - started
        for e in endpoints:
            state = getattr(e, "cache_state", "n/a")
            checks.append(Check(f"{e.name} on {e.node_ip}", True, f"ready after {ready_s:.0f} s (caches were {state})"))
        first, results = run_warmup(cfg, deployment.router(), endpoints, warm, max_in_flight(cfg, len(warm)),
                                    deadline_at)
        checks.extend(Check(w.server, w.error is None, w.line().removeprefix(f"first forward {w.server}: "))
                      for w in first)
        bad = [r for r in results if r.status != "ok"]
        checks.append(Check(
            "warm-up batch", not bad,
            f"{len(results) - len(bad)}/{len(results)} prompts ran (the run's shapes compiled)" if not bad else
            f"{len(bad)}/{len(results)} failed, first: {bad[0].error}",
        ))
    return checks


def run_prepare(cfg: RunConfig, state_path: Path | None = None, compile_caches: bool = True) -> PrepareReport:
    """Checks, every node's dataset and tokenizer, then (real SGLang) the compile caches."""
    from orchestrator.cluster.connect import connect

    started = time.monotonic()
    report = PrepareReport(cfg.name, cfg.layout.describe(), cfg.engine.kind, checks=config_checks(cfg))
    if not all(c.ok for c in report.checks):
        report.seconds = time.monotonic() - started
        return report
    session = connect(cfg, state_path)
    try:
        report.nodes = prepare_nodes(cfg)
        if not compile_caches:
            report.compile = [Check("skipped", True, "--no-compile: engines not started")]
        elif all(n.ok for n in report.nodes):
            try:  # the deployment attaches to this session's cluster
                report.compile = build_compile_caches(cfg, state_path)
            except Exception as exc:
                report.compile = [Check("engines", False, f"{type(exc).__name__}: {exc}")]
    finally:
        session.close()
    report.seconds = time.monotonic() - started
    return report
