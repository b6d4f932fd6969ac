"""A batch job script (Slurm or PBS) that brings up the labelled 2-node Ray cluster and runs the work.

RunConfig + JobOptions -> render(...) -> bash text, from the template orchestrator/data/jobscript/job.sh.tmpl
(sections: settings, nodes, clean-up, Ray bring-up, prepare, work, collect). The scheduler decides only the
resource lines, where the allocation's nodes and ids come from, and how one process is launched on one node
(`srun`, `pbsdsh` or `mpirun`); everything else is the same script. What runs on the nodes at job time is
orchestrator.cluster.batch (fabric IP, waiting for the nodes, the Ray job's real verdict).
"""

from __future__ import annotations

import math
import re
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from orchestrator.config import ConfigError, RunConfig, dump_config

TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "jobscript" / "job.sh.tmpl"
SCHEDULERS = ("slurm", "pbs")
PBS_LAUNCHERS = ("pbsdsh", "mpirun")
DEFAULT_MARGIN_S = 900.0  # walltime beyond the deadline: Ray bring-up, prepare (cold compile caches), collect
DEFAULT_DRAIN_S = 30.0  # serve's own --drain-s default


@dataclass(frozen=True)
class StopBudget:
    """Seconds the job's clean-up gives each part of a stop (scancel/qdel/the walltime: SIGTERM, then SIGKILL after the
    scheduler's delay): the running step to write what it finished, Ray's job supervisor before it SIGKILLs a stopped
    driver, a signalled node's Ray waiting for that, and its Ray between SIGTERM and SIGKILL."""

    kill_delay_doc: str
    step_stop_s: int
    job_stop_wait_s: int
    node_grace_s: int
    ray_stop_s: int


# A signalled node ends node_grace_s (at most; it goes on once the step is stopped) + ray_stop_s + its log copy after
# the SIGTERM. Slurm: within KillWait (30 s by default; the lab's cancelled bench ended 16 s after scancel). PBS: within
# the queue's kill_delay, 10 s by default (OpenPBS, Torque), which `qdel -W SECONDS` lengthens for one job.
STOP_BUDGETS = {
    "slurm": StopBudget("Slurm's KillWait (30 s by default)", step_stop_s=15, job_stop_wait_s=10, node_grace_s=15,
                        ray_stop_s=10),
    "pbs": StopBudget("PBS's kill_delay (10 s by default; qdel -W SECONDS sets it for one job)", step_stop_s=5,
                      job_stop_wait_s=4, node_grace_s=5, ray_stop_s=2),
}


class JobScriptError(ConfigError):
    """A jobscript option or config that cannot make a job; the message names the option and the fix."""

    def __init__(self, problem: str):
        super().__init__("jobscript", [problem])


@dataclass(frozen=True)
class JobOptions:
    scheduler: str
    then: str = "bench"
    iface: str = "auto"
    margin_s: float = DEFAULT_MARGIN_S
    startup_s: float = 0.0  # serve+goodput: Ray bring-up + prepare + serve until ready
    startup_source: str = "--startup-s"  # where startup_s came from, for the walltime line
    drain_s: float = DEFAULT_DRAIN_S  # serve+goodput: serve's drain on `serve down`
    aiperf_s: tuple[tuple[int, float], ...] = ()  # serve+goodput: (N, seconds of its AIPerf command) per declared N
    aiperf_source: str = ""  # how aiperf_s was sized, for the walltime line
    max_walltime_s: float | None = None  # the scheduler's limit the user gave: a longer job is refused
    gpus_per_node: int | None = None  # None: cluster.gpus_per_node for real engines, 0 (no request) for the sim
    cpus_per_node: int | None = None
    partition: str | None = None  # Slurm partition / PBS queue
    account: str | None = None
    launcher: str | None = None  # PBS: pbsdsh (default) or mpirun; Slurm: srun
    ray_port: int = 6379
    dashboard_port: int = 8265
    bringup_timeout_s: float = 300.0
    run_subdir: str = "pdo-runs"
    python: str = field(default_factory=lambda: sys.executable)
    python_in_submit_dir: bool = False  # a bundle: PDO_PYTHON defaults to $SUBMIT_DIR/.venv (build/install.sh)
    generated_by: str = ""


# ---- the work after `prepare`: one entry per --then value ----------------------------------------------


def _bench_work(cfg: RunConfig) -> str:
    """`bench` as a Ray job; its verdict is the driver's exit code (0 = VALID), read through the job API, since
    `ray job submit` itself exits 1 for any failure and 0 for a job it merely saw end. On scancel/qdel the clean-up
    stops it through Ray's job API (SIGTERM to the driver: it stops the batch and writes the prompts that finished and
    the ones in flight failed with their reason), then the client."""
    return """\
  SUBMISSION_ID=pdo-$JOB_ID-bench-$(date +%s)
  stop_bench() {  # Ray's job stop, then until the driver has written its result and report (it tears down after)
    local tries=$((PDO_STEP_STOP_S * 2))
    "$PDO_PYTHON" -m orchestrator.cluster.batch job-stop --dashboard "$DASHBOARD" --id "$SUBMISSION_ID" 2>&1 \\
      | tee -a "$RUN_DIR/logs/bench-stop.log"
    while [ "$tries" -gt 0 ] && kill -0 "$STEP_PID" 2>/dev/null; do  # the client ends with the driver
      # result.json, then report.html from it (each written whole); Ray's stop on the nodes (next) would cut the report
      ls "$RUN_DIR"/runs/*/report.html > /dev/null 2>&1 && break
      sleep 0.5; tries=$((tries - 1))
    done
    step_term  # the client; written or out of time, the driver goes with Ray's stop
  }
  STEP_STOP=stop_bench
  run_step "$RUN_DIR/logs/bench.log" "$PDO_RAY" job submit --address "$DASHBOARD" --submission-id "$SUBMISSION_ID" -- \\
    "$PDO_PYTHON" -m orchestrator bench --config "$RUN_DIR/config.yaml" --result-dir "$RUN_DIR/runs"
  log "ray job submit exited $?; the job's own verdict:"
  "$PDO_PYTHON" -m orchestrator.cluster.batch job-status --dashboard "$DASHBOARD" --id "$SUBMISSION_ID" \\
    | tee "$RUN_DIR/logs/job-status.log"
  WORK_RC=${PIPESTATUS[0]}"""


# `serve --detach` returns once every PD pair is warmed and the gateway answers (its ready line), or when serve failed
# or was not ready within the start-up budget; the service's state file names its PID and gateway.
SERVE_GOODPUT_WORK = r"""
  SERVE_DIR=$RUN_DIR/serve                      # serve's state file, control socket and log (<name>.log)
  SERVE_NAME=@SERVE_NAME@
  PDO_READY_TIMEOUT_S=${PDO_READY_TIMEOUT_S:-@STARTUP_S@}
  PDO_DRAIN_S=${PDO_DRAIN_S:-@DRAIN_S@}
  read -ra GOODPUT_ARGS <<< "${PDO_GOODPUT_ARGS:-}"   # e.g. "--window-s 20" while exploring; empty for the score
  service_field() { "$PDO_PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])'     "$SERVE_DIR/$SERVE_NAME.json" "$1" 2>/dev/null; }
  stop_work() {  # drain and stop the service this job started: `serve down`, then its session by PID if still there
    [ -f "$RUN_DIR/goodput/goodput.json" ] && cp "$RUN_DIR/goodput/goodput.json" "$RUN_DIR/goodput.json"
    [ -n "${SERVE_PID:-}" ] || SERVE_PID=$(service_field pid)
    [ -n "$SERVE_PID" ] && [ -z "${SERVE_STOPPED:-}" ] || return 0
    SERVE_STOPPED=1
    if [ -n "$STOPPED_BY" ]; then
      # the scheduler's SIGKILL is seconds away (PBS: 10 s) and `serve down`'s teardown takes longer; the stopped
      # goodput has ended every request (nothing to drain), and each node's Ray stop ends the workers and engines
      log "serve: SIGTERM to its session (pid $SERVE_PID), not waited for: Ray's stop ends its workers"
      kill -TERM -- "-$SERVE_PID" 2>/dev/null
      return 0
    fi
    log "serve down (pid $SERVE_PID; drain at most $PDO_DRAIN_S s)"
    "$PDO_PYTHON" -m orchestrator serve down --state-dir "$SERVE_DIR" --name "$SERVE_NAME"       --timeout-s "$(awk -v d="$PDO_DRAIN_S" 'BEGIN { printf "%d", d + 300 }')" 2>&1 | tee -a "$RUN_DIR/logs/serve-down.log"
    SERVE_DOWN_RC=${PIPESTATUS[0]}
    if ! wait_pids 60 "$SERVE_PID"; then  # `serve down` returns with the last line; the process exits after it
      log "serve (pid $SERVE_PID) still runs 60 s after serve down: SIGTERM, then SIGKILL, to its session"
      kill -TERM -- "-$SERVE_PID" 2>/dev/null
      wait_pids 30 "$SERVE_PID" || kill -KILL -- "-$SERVE_PID" 2>/dev/null
    fi
  }
  end_work() { [ -z "$STOPPED_BY" ] || [ -z "${SERVE_PID:-}" ] || kill -KILL -- "-$SERVE_PID" 2>/dev/null; }
  log "serve: starting (ready within $PDO_READY_TIMEOUT_S s, else the job stops)"
  run_step "$RUN_DIR/logs/serve-up.log" "$PDO_PYTHON" -m orchestrator serve --config "$RUN_DIR/config.yaml" \
    --state-dir "$SERVE_DIR" --detach --ready-timeout-s "$PDO_READY_TIMEOUT_S" --drain-s "$PDO_DRAIN_S"
  SERVE_RC=$?
  SERVE_PID=$(service_field pid)
  GATEWAY=$(service_field gateway)
  T_READY=$(now)
  log "serve: exit $SERVE_RC after $(seconds "$T_PREPARE" "$T_READY") s; gateway ${GATEWAY:-none}"
  if [ "$SERVE_RC" = 0 ] && [ -n "$GATEWAY" ]; then
    # a stop is a SIGTERM to goodput alone: it has AIPerf cancel the N running and write its records (AIPerf's own
    # SIGTERM would kill it with none); goodput.json keeps the rows of the N that finished
    stop_goodput() { kill -TERM "$STEP_PID" 2>/dev/null; }
    STEP_STOP=stop_goodput
    run_step "$RUN_DIR/logs/goodput.log" "$PDO_PYTHON" -m orchestrator goodput --config "$RUN_DIR/config.yaml" \
      --url "$GATEWAY" --out "$RUN_DIR/goodput" "${GOODPUT_ARGS[@]}"
    WORK_RC=$?
  else
    log "ERROR: serve did not come up; goodput is not run (see $RUN_DIR/logs/serve-up.log and $SERVE_DIR/$SERVE_NAME.log)"
    WORK_RC=$SERVE_RC; [ "$WORK_RC" = 0 ] && WORK_RC=1
  fi
  T_GOODPUT=$(now)
  stop_work
  printf -v WORK_JSON ', "serve_exit": %s, "serve_ready_s": %s, "goodput_s": %s, "serve_down_exit": %s' \
    "$SERVE_RC" "$(seconds "$T_PREPARE" "$T_READY")" "$(seconds "$T_READY" "$T_GOODPUT")" "${SERVE_DOWN_RC:-null}"
""".strip("\n")


def _serve_goodput_work(cfg: RunConfig, opts: JobOptions) -> str:
    """`serve --detach` on the head, then `goodput --url` (the contest's closed-loop AIPerf command per declared N)
    against its gateway, then `serve down` (drain, teardown; by PID if it does not answer); the verdict is goodput's
    exit code."""
    return (SERVE_GOODPUT_WORK.replace("@SERVE_NAME@", shlex.quote(cfg.name))
            .replace("@STARTUP_S@", f"{opts.startup_s:.0f}").replace("@DRAIN_S@", f"{opts.drain_s:g}"))


# one entry per --then value: the bash of section 6 (it sets WORK_RC, may define stop_work and WORK_JSON)
WORKS: dict[str, Callable[[RunConfig, JobOptions], str]] = {
    "bench": lambda cfg, opts: _bench_work(cfg), "serve+goodput": _serve_goodput_work}
WORK_DOCS = {"bench": "bench through `ray job submit`; its verdict read from the job's driver exit code",
             "serve+goodput": "serve --detach (ready = every PD pair warmed), goodput --url (the contest's AIPerf "
                              "command), serve down; the verdict is goodput's exit code"}


# ---- what differs per scheduler -------------------------------------------------------------------------


def wall_deadline_s(cfg: RunConfig) -> float:
    """benchmark.deadline_s in wall seconds (a simulated engine's times are scaled by engine.sim.time_scale)."""
    return cfg.benchmark.deadline_s * (cfg.engine.sim.time_scale if cfg.simulated else 1.0)


def walltime(cfg: RunConfig, margin_s: float) -> str:
    """HH:MM:SS of the deadline plus the bring-up margin, rounded up to a whole minute (a bench job)."""
    return hhmmss(wall_deadline_s(cfg) + margin_s)


def hhmmss(seconds: float) -> str:
    """Seconds as a scheduler's HH:MM:SS, rounded up to a whole minute."""
    minutes = math.ceil(seconds / 60)
    return f"{minutes // 60:02d}:{minutes % 60:02d}:00"


def aiperf_phases_s(warmup_s: float, window_s: float, grace_s: float, concurrency: int, output_tokens: int,
                    output_tok_s: float) -> float:
    """An AIPerf closed-loop command's timed phases: warm-up and window, each followed by the wait for the requests
    still in flight when it ends (AIPerf waits for them before the next phase and before its results). A closed loop
    of N requests at a throughput of output_tok_s takes N x OSL / output_tok_s per request (Little's law); that wait
    is at most grace_s (AIPerf's --benchmark-grace-period)."""
    latency_s = concurrency * output_tokens / output_tok_s if output_tok_s > 0 else math.inf
    return warmup_s + window_s + 2 * min(grace_s, latency_s)


def job_seconds(cfg: RunConfig, opts: JobOptions) -> tuple[float, str]:
    """(walltime seconds before rounding, what they are made of) for opts.then's job."""
    if opts.then != "serve+goodput":
        return wall_deadline_s(cfg) + opts.margin_s, (
            f"benchmark.deadline_s {wall_deadline_s(cfg):g} s + margin {opts.margin_s:g} s (--margin-s)")
    ns = list(cfg.benchmark.concurrency)
    allowance = dict(opts.aiperf_s)
    if missing := [n for n in ns if n not in allowance]:
        raise JobScriptError(f"no AIPerf allowance for N={','.join(map(str, missing))}: JobOptions.aiperf_s needs one "
                             "per benchmark.concurrency (the jobscript command sizes them)")
    aiperf = sum(allowance[n] for n in ns)
    runs = " + ".join(f"N={n} {allowance[n]:.0f}" for n in ns)
    return opts.startup_s + aiperf + opts.drain_s + opts.margin_s, (
        f"start-up budget {opts.startup_s:g} s ({opts.startup_source}) + {len(ns)} AIPerf run(s) {aiperf:.0f} s "
        f"({runs}; {opts.aiperf_source}) + drain {opts.drain_s:g} s + margin {opts.margin_s:g} s (--margin-s)")


def walltime_line(cfg: RunConfig, opts: JobOptions) -> str:
    """The job's walltime and its parts, one line (printed at generation, and in the script's header)."""
    total, parts = job_seconds(cfg, opts)
    return f"walltime {hhmmss(total)} = {parts}"


def parse_walltime(text: str) -> float:
    """A scheduler limit as given (HH:MM:SS, H:MM, or minutes) in seconds; ValueError if it is none of them."""
    parts = text.strip().split(":")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        raise ValueError(text)
    if len(parts) == 1:
        return 60.0 * int(parts[0])
    values = [int(p) for p in parts] + [0] * (3 - len(parts))
    return 3600.0 * values[0] + 60.0 * values[1] + values[2]


def _job_name(cfg: RunConfig, limit: int) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", f"pdo-{cfg.name}")[:limit]


def _slurm_resources(cfg: RunConfig, opts: JobOptions, gpus: int) -> list[str]:
    lines = [f"--job-name={_job_name(cfg, 64)}", "--nodes=2", "--ntasks-per-node=1", "--exclusive",
             f"--time={hhmmss(job_seconds(cfg, opts)[0])}", "--output=pdo-%x-%j.out"]
    if gpus:
        lines.insert(3, f"--gpus-per-node={gpus}")
    if opts.cpus_per_node:
        lines.insert(3, f"--cpus-per-task={opts.cpus_per_node}")
    lines += [f"--partition={opts.partition}"] * bool(opts.partition) + [f"--account={opts.account}"] * bool(opts.account)
    return [f"#SBATCH {line}" for line in lines]


def _pbs_resources(cfg: RunConfig, opts: JobOptions, gpus: int) -> list[str]:
    chunk = "select=2" + (f":ncpus={opts.cpus_per_node}" if opts.cpus_per_node else "") + (
        f":ngpus={gpus}" if gpus else "") + ":mpiprocs=1"
    lines = [f"-N {_job_name(cfg, 15)}", f"-l {chunk}", "-l place=scatter:excl",
             f"-l walltime={hhmmss(job_seconds(cfg, opts)[0])}", "-j oe"]
    lines += [f"-q {opts.partition}"] * bool(opts.partition) + [f"-A {opts.account}"] * bool(opts.account)
    return [f"#PBS {line}" for line in lines]


SLURM_ENV = """\
SUBMIT_DIR=${SLURM_SUBMIT_DIR:-$PWD}
JOB_ID=${SLURM_JOB_ID:?not inside a Slurm job: submit this script with sbatch}"""

PBS_ENV = """\
SUBMIT_DIR=${PBS_O_WORKDIR:-$PWD}
JOB_ID=${PBS_JOBID:?not inside a PBS job: submit this script with qsub}
JOB_ID=${JOB_ID%%.*}                            # 1234.server -> 1234
cd "$SUBMIT_DIR" || exit 1"""

SLURM_NODES = 'mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")'

# PBS_NODEFILE has one line per MPI rank (mpiprocs=1: one per node); pbsdsh -n counts those lines.
PBS_NODES = """\
mapfile -t _LINES < "${PBS_NODEFILE:?not inside a PBS job: PBS_NODEFILE is unset}"
NODES=(); NODE_INDEX=()
for i in "${!_LINES[@]}"; do
  case " ${NODES[*]} " in *" ${_LINES[$i]} "*) ;; *) NODES+=("${_LINES[$i]}"); NODE_INDEX+=("$i") ;; esac
done"""

# Every launcher runs CMD through the same wrapper, so the output lands in LOGFILE on any scheduler
# (pbsdsh and mpirun give no per-task output file of their own).
_WRAP = """/bin/bash -c 'log=$1; shift; exec "$@" > "$log" 2>&1' pdo-launch "$logfile" "$@\""""

LAUNCHERS = {
    "srun": f"""\
launch_on() {{
  local index=$1 node=$2 logfile=$3; shift 3
  srun --overlap --nodes=1 --ntasks=1 --nodelist="$node" --kill-on-bad-exit=0 {_WRAP} &
  STARTED+=($!)
}}""",
    "pbsdsh": f"""\
PDO_PBSDSH=${{PDO_PBSDSH:-pbsdsh}}
launch_on() {{
  local index=$1 node=$2 logfile=$3; shift 3
  "$PDO_PBSDSH" -n "${{NODE_INDEX[$index]}}" -- {_WRAP} &
  STARTED+=($!)
}}""",
    "mpirun": f"""\
PDO_MPIRUN=${{PDO_MPIRUN:-mpirun}}
launch_on() {{
  local index=$1 node=$2 logfile=$3; shift 3
  "$PDO_MPIRUN" -np 1 --host "$node" {_WRAP} &
  STARTED+=($!)
}}""",
}


def _launcher(opts: JobOptions) -> str:
    if opts.scheduler == "slurm":
        if opts.launcher not in (None, "srun"):
            raise JobScriptError(f"--launcher {opts.launcher}: Slurm jobs launch with srun; drop --launcher")
        return "srun"
    launcher = opts.launcher or "pbsdsh"
    if launcher not in PBS_LAUNCHERS:
        raise JobScriptError(f"--launcher {launcher}: PBS jobs launch with one of {', '.join(PBS_LAUNCHERS)}")
    return launcher


def check(cfg: RunConfig, opts: JobOptions) -> None:
    """One-line errors for what cannot make a job (before any text is written)."""
    if opts.scheduler not in SCHEDULERS:
        raise JobScriptError(f"--scheduler {opts.scheduler}: choose one of {', '.join(SCHEDULERS)}")
    if opts.then not in WORKS:
        raise JobScriptError(f"--then {opts.then}: choose one of {', '.join(WORKS)}")
    if opts.then == "bench" and cfg.benchmark.kind == "closed_loop":
        raise JobScriptError("--then bench: benchmark.kind=closed_loop, which bench refuses (it runs a prompt "
                             "batch), so the job would fail after Ray bring-up and prepare; measure the closed loop "
                             "with --then serve+goodput, or set benchmark.kind: batch")
    if opts.then == "serve+goodput" and cfg.benchmark.kind != "closed_loop":
        raise JobScriptError(f"--then serve+goodput: benchmark.kind={cfg.benchmark.kind} is not a serving config "
                             "(goodput runs the closed-loop AIPerf command of benchmark.kind: closed_loop, as in "
                             "configs/qwen3-pd-2026.yaml); run a prompt batch with --then bench")
    env = cfg.router.api_key_env
    if env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", env):
        raise JobScriptError(f"router.api_key_env={env!r}: the job exports it by name; give an environment "
                             "variable name such as PDO_API_KEY")
    for name, value in (("--startup-s", opts.startup_s), ("--drain-s", opts.drain_s), ("--margin-s", opts.margin_s)):
        if value < 0:
            raise JobScriptError(f"{name} {value:g}: give seconds of at least 0")
    if opts.max_walltime_s is not None:
        total, parts = job_seconds(cfg, opts)
        if math.ceil(total / 60) * 60 > opts.max_walltime_s:
            fewer = (", declare fewer N (--set 'benchmark.concurrency=[32]')" if opts.then == "serve+goodput"
                     else "")
            raise JobScriptError(f"--max-walltime {hhmmss(opts.max_walltime_s)}: the job needs {hhmmss(total)} "
                                 f"({parts}); lower --startup-s / --margin-s{fewer}, or ask the scheduler for more")
    if cfg.cluster.num_nodes != 2:
        raise JobScriptError(f"cluster.num_nodes={cfg.cluster.num_nodes}: the job script brings up 2 nodes "
                             "(a prefill node as the Ray head and a decode node); set cluster.num_nodes: 2")
    if not re.fullmatch(r"[A-Za-z0-9_.:-]+", opts.iface):
        raise JobScriptError(f"--iface {opts.iface!r}: an interface name such as ib0, eth0 or auto")


def _gpus(cfg: RunConfig, opts: JobOptions) -> int:
    if opts.gpus_per_node is not None:
        return opts.gpus_per_node
    return 0 if cfg.simulated else cfg.cluster.gpus_per_node


def render(cfg: RunConfig, opts: JobOptions, git_sha: str | None = None) -> str:
    """The job script's text for `cfg` (its resolved config embedded verbatim)."""
    check(cfg, opts)
    gpus = _gpus(cfg, opts)
    launcher = _launcher(opts)
    slurm = opts.scheduler == "slurm"
    resources = (_slurm_resources if slurm else _pbs_resources)(cfg, opts, gpus)
    # every driver of the job runs on the head with RAY_ADDRESS set (by the script, or by Ray inside the job)
    job_cfg = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"address": "auto"})})
    config_yaml = dump_config(job_cfg).rstrip("\n")
    if re.search(r"^PDO_CONFIG$", config_yaml, re.M):
        raise JobScriptError("the config contains a line 'PDO_CONFIG', the job script's heredoc marker; rename it")
    roles = cfg.cluster.roles
    values = {
        "RESOURCE_LINES": "\n".join(resources),
        "GENERATED_BY": opts.generated_by or f"--scheduler {opts.scheduler} --then {opts.then}",
        "GENERATED_AT": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "GIT_SHA": git_sha or "unknown",
        "LABEL_KEY": shlex.quote(roles.label_key),
        "HEAD_ROLE": shlex.quote(roles.prefill),
        "WORKER_ROLE": shlex.quote(roles.decode),
        "LAUNCHER": launcher,
        "WORK_NAME": opts.then,
        "RUN_DIR_DOC": f"$SUBMIT_DIR/{opts.run_subdir}/<job id>",
        "PYTHON": '"$SUBMIT_DIR/.venv/bin/python"' if opts.python_in_submit_dir else shlex.quote(opts.python),
        "IFACE": shlex.quote(opts.iface),
        "RAY_PORT": str(opts.ray_port),
        "DASHBOARD_PORT": str(opts.dashboard_port),
        "BRINGUP_TIMEOUT_S": f"{opts.bringup_timeout_s:.0f}",
        "NUM_GPUS": str(cfg.cluster.gpus_per_node),
        "NUM_CPUS": str(opts.cpus_per_node or ""),
        "SCHEDULER_ENV": SLURM_ENV if slurm else PBS_ENV,
        "RUN_SUBDIR": shlex.quote(opts.run_subdir),
        "CONFIG_YAML": config_yaml,
        "NODE_LIST": SLURM_NODES if slurm else PBS_NODES,
        "LAUNCH": LAUNCHERS[launcher],
        "WORK": WORKS[opts.then](cfg, opts),
        "WORK_DOC": WORK_DOCS[opts.then],
        "WALLTIME_LINE": walltime_line(cfg, opts),
        "API_KEY_ENV": cfg.router.api_key_env or "",
        "KILL_DELAY_DOC": STOP_BUDGETS[opts.scheduler].kill_delay_doc,
        "STEP_STOP_S": str(STOP_BUDGETS[opts.scheduler].step_stop_s),
        "JOB_STOP_WAIT_S": str(STOP_BUDGETS[opts.scheduler].job_stop_wait_s),
        "NODE_GRACE_S": str(STOP_BUDGETS[opts.scheduler].node_grace_s),
        "RAY_STOP_S": str(STOP_BUDGETS[opts.scheduler].ray_stop_s),
    }
    text = TEMPLATE.read_text()
    # the config goes in last: its text is data, never scanned for placeholders
    for key, value in values.items():
        if key != "CONFIG_YAML":
            text = text.replace(f"@@{key}@@", value)
    left = sorted(set(re.findall(r"@@([A-Z_]+)@@", text)) - {"CONFIG_YAML"})
    if left:
        raise AssertionError(f"job script template placeholders without a value: {left}")
    return text.replace("@@CONFIG_YAML@@", config_yaml)
