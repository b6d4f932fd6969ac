"""`pd-orchestrator jobscript`: the generated Slurm/PBS script's key lines, its bash syntax, the errors a user
gets for what cannot make a job, the fabric-IP choice, and the `--bundle` submission folder's contents.

The scripts really run in tests/multihost/test_batch_jobs.py (Slurm in network namespaces, PBS's logic)."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.cluster.batch import FabricError, fabric_ip
from orchestrator.cli.jobscript import aiperf_allowance
from orchestrator.cluster.jobscript import JobOptions, aiperf_phases_s, hhmmss, render, walltime
from orchestrator.config import dump_config, load_config
from tests.support import sim_config

REPO = Path(__file__).resolve().parents[2]


def _bash_n(text: str, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(text)
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def _config_file(tmp_path: Path, overrides: dict | None = None) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(dump_config(sim_config(overrides)))
    return path


def test_slurm_script_requests_the_layout_and_labels_the_nodes(tmp_path, capsys):
    cfg_path = _config_file(tmp_path, {"engine.kind": "sglang", "cluster.roles.label_key": "pdo-role",
                                       "benchmark.deadline_s": 420})
    assert main(["jobscript", "--scheduler", "slurm", "--config", str(cfg_path), "--iface", "ib0",
                 "--partition", "gpu", "--account", "team7"]) == 0
    text = capsys.readouterr().out
    _bash_n(text, tmp_path)
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    directives = [line for line in lines if line.startswith("#SBATCH")]
    # 420 s + 900 s margin = 22 min; 8 GPUs per node for a real engine; one task (process) per node
    assert directives == ["#SBATCH --job-name=pdo-test", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1",
                          "#SBATCH --gpus-per-node=8", "#SBATCH --exclusive", "#SBATCH --time=00:22:00",
                          "#SBATCH --output=pdo-%x-%j.out", "#SBATCH --partition=gpu", "#SBATCH --account=team7"]
    # directives come before the first command (sbatch stops reading them there)
    first_command = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
    assert all(lines.index(d) < first_command for d in directives)
    assert "PDO_IFACE=${PDO_IFACE:-ib0}" in text
    assert "LABEL_KEY=pdo-role" in text and "HEAD_ROLE=prefill" in text and "WORKER_ROLE=decode" in text
    assert '"--labels=$LABEL_KEY=$ROLE"' in text
    assert 'mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")' in text
    assert 'srun --overlap --nodes=1 --ntasks=1 --nodelist="$node"' in text
    assert "export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=token" in text
    assert "(umask 077;" in text and "secrets.token_hex(32)" in text and 'rm -f "$RUN_DIR/ray-token"' in text
    assert "trap cleanup EXIT" in text and "ray stop" not in text.replace("never `ray stop`", "")
    # prepare, then the work as a Ray job whose real verdict comes from the job API
    prepare, submit = text.index("-m orchestrator prepare"), text.index('"$PDO_RAY" job submit')
    status = text.index("orchestrator.cluster.batch job-status")
    assert prepare < submit < status and "WORK_RC=${PIPESTATUS[0]}" in text[status:]
    assert '--result-dir "$RUN_DIR/runs"' in text and 'cp "$result" "$RUN_DIR/result.json"' in text
    # every long step runs in the background, so a signal reaches the trap at once; scancel stops the bench through
    # Ray (SIGTERM to its driver, which writes what finished), then the clean-up collects before Ray is stopped
    assert 'run_step "$RUN_DIR/logs/prepare.log" "$PDO_PYTHON" -m orchestrator prepare' in text
    assert 'run_step "$RUN_DIR/logs/bench.log" "$PDO_RAY" job submit' in text
    assert "-m orchestrator.cluster.batch job-stop --dashboard \"$DASHBOARD\" --id \"$SUBMISSION_ID\"" in text
    cleanup = text[text.index("cleanup() {"):text.index("trap cleanup EXIT")]
    order = [cleanup.index(piece) for piece in ("stop_step", "stop_work", 'touch "$RUN_DIR/pids/work-stopped"',
                                                "|| collect\n", "stopping Ray on every node")]
    assert order == sorted(order), order
    assert "printf 'export RAY_JOB_STOP_WAIT_TIME_S=%q" in text
    # the embedded config is the resolved one, attached to the job's own cluster (RAY_ADDRESS on the head)
    embedded = yaml.safe_load(text.split("<<'PDO_CONFIG'\n", 1)[1].split("\nPDO_CONFIG\n", 1)[0])
    expected = yaml.safe_load(dump_config(load_config(cfg_path)))
    assert embedded["cluster"].pop("address") == "auto" and expected["cluster"].pop("address") == "local"
    assert embedded == expected
    assert "export RAY_ADDRESS=$HEAD_IP:$PDO_RAY_PORT" in text


def test_pbs_script_uses_pbs_resources_nodefile_and_launcher(tmp_path):
    cfg = sim_config({"engine.sim.time_scale": 20.0, "benchmark.deadline_s": 8.0})
    text = render(cfg, JobOptions(scheduler="pbs", cpus_per_node=4, partition="normal", account="p123"))
    _bash_n(text, tmp_path)
    directives = [line for line in text.splitlines() if line.startswith("#PBS")]
    # the sim asks for no GPUs (its raylets still advertise 8 logical ones); 8 s x 20 = 160 s + 900 s -> 18 min
    assert directives == ["#PBS -N pdo-test", "#PBS -l select=2:ncpus=4:mpiprocs=1", "#PBS -l place=scatter:excl",
                          "#PBS -l walltime=00:18:00", "#PBS -j oe", "#PBS -q normal", "#PBS -A p123"]
    assert "NUM_GPUS=8" in text and "NUM_CPUS=4" in text
    assert 'mapfile -t _LINES < "${PBS_NODEFILE:?' in text and "JOB_ID=${JOB_ID%%.*}" in text
    assert '"$PDO_PBSDSH" -n "${NODE_INDEX[$index]}" --' in text and "srun" not in text
    mpirun = render(cfg, JobOptions(scheduler="pbs", launcher="mpirun"))
    _bash_n(mpirun, tmp_path)
    assert '"$PDO_MPIRUN" -np 1 --host "$node"' in mpirun and "pbsdsh -n" not in mpirun


@pytest.mark.parametrize(("scheduler", "kill_delay_s"), [("pbs", 10), ("slurm", 30)])
def test_a_stopped_job_ends_before_its_schedulers_sigkill(scheduler, kill_delay_s):
    """qdel's SIGKILL comes the queue's kill_delay (PBS's default 10 s) after its SIGTERM, scancel's KillWait (30 s)
    after: a signalled node waits for the step at most PDO_NODE_GRACE_S, gives its Ray PDO_RAY_STOP_S between SIGTERM
    and SIGKILL, then copies its logs (~2 s), all before the scheduler's SIGKILL, which would not reach Ray (it runs in
    its own session); the step's stop ends first, and Ray's supervisor kills a stopped driver within it."""
    text = render(sim_config(), JobOptions(scheduler=scheduler))
    budget = {name: int(re.search(rf"^{name}=\${{{name}:-(\d+)}}", text, re.M).group(1))  # type: ignore[union-attr]
              for name in ("PDO_STEP_STOP_S", "PDO_JOB_STOP_WAIT_S", "PDO_NODE_GRACE_S", "PDO_RAY_STOP_S")}
    assert budget["PDO_NODE_GRACE_S"] + budget["PDO_RAY_STOP_S"] + 2 <= kill_delay_s, budget
    assert budget["PDO_JOB_STOP_WAIT_S"] < budget["PDO_STEP_STOP_S"] <= budget["PDO_NODE_GRACE_S"], budget
    assert 'seq $((PDO_RAY_STOP_S * 2))' in text and "PDO_RAY_STOP_S=%q" in text  # node.sh's stop_session reads it


def test_serve_goodput_job_serves_measures_then_stops_the_service(tmp_path, capsys):
    """The 2026 contest's job: serve until ready, goodput against its gateway, serve down, goodput's verdict; its
    walltime is the start-up budget + one AIPerf command per declared N + the drain + the margin, printed."""
    assert main(["jobscript", "--scheduler", "slurm", "--config", QWEN3_PRESET, "--then", "serve+goodput",
                 "--startup-s", "600", "--margin-s", "300", "--set", "benchmark.concurrency=[32]",
                 "--set", "router.api_key_env=CONTEST_KEY", "--max-walltime", "00:30:00"]) == 0
    captured = capsys.readouterr()
    text = captured.out
    _bash_n(text, tmp_path)
    # 600 s + N=32's AIPerf command (its allowance, tested below) + 30 s drain + 300 s margin
    cfg = load_config(QWEN3_PRESET, ["benchmark.concurrency=[32]"])
    ((n, aiperf_s),), how = aiperf_allowance(cfg)
    walltime_s = hhmmss(600 + aiperf_s + 30 + 300)
    line = (f"walltime {walltime_s} = start-up budget 600 s (--startup-s) + 1 AIPerf run(s) {aiperf_s:.0f} s "
            f"(N=32 {aiperf_s:.0f}; {how}) + drain 30 s + margin 300 s (--margin-s)")
    assert n == 32 and captured.err.strip() == f"jobscript: {line}"
    assert f"#SBATCH --time={walltime_s}" in text and f"# {line}" in text and "#SBATCH --gpus-per-node=8" not in text
    # prepare, then serve until its ready line, goodput at its gateway, serve down; the verdict is goodput's
    order = [text.index(piece) for piece in (
        "-m orchestrator prepare", '-m orchestrator serve --config "$RUN_DIR/config.yaml"',
        '--state-dir "$SERVE_DIR" --detach', '-m orchestrator goodput --config "$RUN_DIR/config.yaml"', 'WORK_RC=$?\n  else',
        "T_GOODPUT=$(now)\n  stop_work\n", "# ---- 7. collect")]
    assert order == sorted(order), order
    assert "PDO_READY_TIMEOUT_S=${PDO_READY_TIMEOUT_S:-600}" in text and "PDO_DRAIN_S=${PDO_DRAIN_S:-30}" in text
    assert 'serve down --state-dir "$SERVE_DIR" --name "$SERVE_NAME"' in text and "SERVE_NAME=qwen3-pd-2026" in text
    assert 'run_step "$RUN_DIR/logs/serve-up.log"' in text and 'run_step "$RUN_DIR/logs/goodput.log"' in text
    # on any exit (scancel, walltime, a failure) the service is stopped before Ray, by `serve down` then its PID
    cleanup = text[text.index("cleanup() {"):text.index("trap cleanup EXIT")]
    assert cleanup.index("stop_work") < cleanup.index("stopping Ray on every node")
    assert 'kill -TERM -- "-$SERVE_PID"' in text and "ray stop" not in text.replace("never `ray stop`", "")
    # after scancel/qdel: goodput alone gets the SIGTERM (it has AIPerf cancel and write its records); the service is
    # not drained (goodput's stop ended every request, and serve down's teardown outlasts PBS's 10 s): SIGTERM to its
    # session, not waited for, and SIGKILL to what is left of it once Ray is stopped
    assert "stop_goodput() { kill -TERM \"$STEP_PID\"" in text and "STEP_STOP=stop_goodput" in text
    signalled = text[text.index('if [ -n "$STOPPED_BY" ]; then\n      #'):text.index('log "serve down')]
    assert 'kill -TERM -- "-$SERVE_PID"' in signalled and "return 0" in signalled
    assert cleanup.index("stopping Ray on every node") < cleanup.index("end_work")
    # the gateway's key: named, checked at job start, handed to the raylets in a mode-600 file, never written out
    assert "API_KEY_ENV=CONTEST_KEY" in text and "(umask 077; printf '%s' \"${!API_KEY_ENV}\" > \"$RUN_DIR/api-key\")" in text
    assert "ray job submit" not in text


def test_the_readme_contest_job_command_writes_the_job_it_describes(tmp_path, capsys, monkeypatch):
    """README's 2026 contest command, as typed there, writes a serve+goodput job with the walltime the README says."""
    readme = (REPO / "README.md").read_text()
    (line,) = [x for x in readme.splitlines() if x.startswith("pd-orchestrator jobscript ") and "serve+goodput" in x]
    words = shlex.split(line)
    assert words[-2:] == [">", "job.sh"]
    monkeypatch.chdir(REPO)
    assert main(words[1:-2]) == 0
    captured = capsys.readouterr()
    _bash_n(captured.out, tmp_path)
    walltime_s = captured.err.split("walltime ", 1)[1].split()[0]
    assert f"here\n{walltime_s}" in readme or f"here {walltime_s}" in readme, walltime_s
    assert "#SBATCH --gpus-per-node=8" in captured.out and "-m orchestrator goodput" in captured.out


def test_walltime_rounds_up_to_whole_minutes():
    assert walltime(sim_config({"benchmark.deadline_s": 420}), 900) == "00:22:00"
    assert walltime(sim_config({"benchmark.deadline_s": 3600}), 1) == "01:01:00"


QWEN3_PRESET = str(REPO / "configs" / "qwen3-pd-2026.yaml")


@pytest.mark.parametrize(("args", "message"), [
    # a prompt batch is no serving workload: goodput's AIPerf command is benchmark.kind: closed_loop's
    (["--then", "serve+goodput"], "--then serve+goodput: benchmark.kind=batch is not a serving config"),
    # the 2026 preset's closed loop: bench refuses it at job time, after Ray bring-up and prepare had run
    (["--config", QWEN3_PRESET], "--then bench: benchmark.kind=closed_loop, which bench refuses (it runs a prompt "
     "batch), so the job would fail after Ray bring-up and prepare; measure the closed loop with --then serve+goodput"),
    # 1200 s start-up + 5 AIPerf commands (251-257 s each) + 30 s drain + 900 s margin = 57 min > 50
    (["--config", QWEN3_PRESET, "--then", "serve+goodput", "--startup-s", "1200", "--max-walltime", "00:50:00"],
     "--max-walltime 00:50:00: the job needs 00:57:00 (start-up budget 1200 s (--startup-s) + 5 AIPerf run(s)"),
    # a bench job: benchmark.deadline_s 300 s + 900 s margin = 20 min
    (["--max-walltime", "19"], "--max-walltime 00:19:00: the job needs 00:20:00 (benchmark.deadline_s 300 s + margin"),
    (["--max-walltime", "2h"], "--max-walltime '2h': give the scheduler's limit as HH:MM:SS"),
    (["--config", QWEN3_PRESET, "--then", "serve+goodput", "--set", "router.api_key_env=MY-KEY"],
     "router.api_key_env='MY-KEY': the job exports it by name"),
    (["--then", "train"], "--then train: choose one of bench, serve+goodput"),
    (["--launcher", "mpirun"], "--launcher mpirun: Slurm jobs launch with srun"),
    (["--iface", "eth0; rm -rf /"], "--iface 'eth0; rm -rf /': an interface name"),
    (["--set", "cluster.num_nodes=4"], "cluster.num_nodes=4: the job script brings up 2 nodes"),
])
def test_what_cannot_make_a_job_is_a_one_line_error(tmp_path, capsys, args, message):
    cfg_path = _config_file(tmp_path)
    assert main(["jobscript", "--scheduler", "slurm", "--config", str(cfg_path), *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip().splitlines() == [captured.err.strip()] and message in captured.err


def test_fabric_ip_prefers_the_named_then_infiniband_then_the_default_route():
    ips = {"eth0": ["10.0.0.5"], "ib0": ["192.168.10.5"], "docker0": ["172.17.0.1"]}
    assert fabric_ip("eth0", ips) == "10.0.0.5"
    assert fabric_ip("auto", ips, route_iface="eth0") == "192.168.10.5"
    assert fabric_ip("auto", {k: v for k, v in ips.items() if k != "ib0"}, route_iface="eth0") == "10.0.0.5"
    assert fabric_ip("auto", {"eth0": ["198.18.0.1"]}, route_iface="") == "198.18.0.1"
    with pytest.raises(FabricError, match="interface ib1 has no IPv4 address here .*eth0 10.0.0.5"):
        fabric_ip("ib1", ips)
    with pytest.raises(FabricError, match="name the fabric one"):
        fabric_ip("auto", {"eth0": ["10.0.0.5"], "eth1": ["10.1.0.5"]}, route_iface="")


def test_bundle_is_a_submission_folder(tmp_path, capsys):
    cfg_path = REPO / "configs" / "default.yaml"  # rules apac-hpcai-2025: w4a8 is not compliant
    out = tmp_path / "submission"
    assert main(["jobscript", "--scheduler", "slurm", "--config", str(cfg_path), "--bundle", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"submission folder {out}" in printed and "NOT COMPLIANT" in printed
    names = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert names == ["README.md", "build/environment.txt", "build/install.sh", "build/pd-orchestrator-src.tar.gz",
                     "build/requirements.lock", "results/README.md", "rules/verdict.json", "rules/verdict.txt",
                     "run/config.yaml", "run/job.sh"]
    script = (out / "run/job.sh").read_text()
    _bash_n(script, tmp_path)
    _bash_n((out / "build/install.sh").read_text(), tmp_path)
    assert (out / "run/job.sh").stat().st_mode & 0o111 and (out / "build/install.sh").stat().st_mode & 0o111
    # the bundle's job runs the folder's own venv and writes into results/
    assert 'PDO_PYTHON=${PDO_PYTHON:-"$SUBMIT_DIR/.venv/bin/python"}' in script
    assert "RUN_DIR=${PDO_RUN_DIR:-$SUBMIT_DIR/results/$JOB_ID}" in script
    # the lock file is this venv's pip freeze: exact pins, ray among them, our own editable line left out
    lock = (out / "build/requirements.lock").read_text().splitlines()
    import ray

    assert f"ray=={ray.__version__}" in lock and all("==" in line or " @ " in line for line in lock)
    assert not any("pd-orchestrator" in line or "pd_orchestrator" in line or line.startswith("-e") for line in lock)
    with tarfile.open(out / "build/pd-orchestrator-src.tar.gz") as tar:
        members = tar.getnames()
    assert "pyproject.toml" in members and "orchestrator/cluster/jobscript.py" in members
    assert not any(m.startswith(("tests/", "benchmarks/")) for m in members)
    env = (out / "build/environment.txt").read_text()
    assert f"ray {ray.__version__}" in env and "pd-orchestrator commit " in env
    verdict = json.loads((out / "rules/verdict.json").read_text())
    assert verdict["profile"] == "apac-hpcai-2025" and verdict["verdict"] == "not compliant"
    assert any(v["field"] == "model.quantization" for v in verdict["violations"])
    assert (out / "rules/verdict.txt").read_text().startswith("rules apac-hpcai-2025: NOT COMPLIANT")
    assert yaml.safe_load((out / "run/config.yaml").read_text())["rules"] == "apac-hpcai-2025"
    assert "sbatch run/job.sh" in (out / "README.md").read_text()



def _step_helpers(text: str) -> str:
    """The job script's helpers from `now()` to the end of `stop_step()`: how a step runs and is stopped."""
    start = text.index("now() {")
    end = text.index("\n}\n", text.index("stop_step() {")) + 3
    return text[start:end]


def test_a_signal_reaches_the_trap_while_a_step_runs_and_the_step_gets_its_stop(tmp_path, capsys):
    """The scheduler's SIGTERM to the batch shell only: bash runs the trap at once (not after the step returns), the
    trap forwards the stop to the step's session, and the step's own handler runs before the shell exits."""
    assert main(["jobscript", "--scheduler", "slurm", "--config", str(_config_file(tmp_path))]) == 0
    step_log = tmp_path / "step.log"
    script = tmp_path / "steps.sh"
    script.write_text(f"""set -uo pipefail
PDO_STEP_STOP_S=10
{_step_helpers(capsys.readouterr().out)}
trap 'stop_step; echo "shell: trapped"; exit 143' TERM
run_step {step_log} bash -c 'trap "echo step: got TERM, writing what finished; exit 7" TERM; echo step: started
  while :; do sleep 0.1; done'
echo "shell: the step returned $?"
""")
    proc = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 20
        while "step: started" not in (step_log.read_text() if step_log.exists() else ""):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.05)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=8)  # the step loops for ever: only the forwarded stop ends it
    finally:
        proc.kill()
    assert proc.returncode == 143 and "shell: trapped" in out and "the step returned" not in out, out
    assert "step: got TERM, writing what finished" in step_log.read_text()
    assert time.monotonic() - signalled < 5, out


def test_the_default_start_up_budget_is_plans_time_to_ready_scaled_by_the_measured_runs(tmp_path, capsys):
    """No --startup-s: the budget is plan's predicted time to ready for this config (prepare: at cold caches, with its
    warm-up and stop; serve: at warm ones) times each caches' worst in-sample measured/plan, plus the measured Ray
    bring-up; the walltime line says so, and serve's ready timeout is that budget. The factors are the ones
    benchmarks/startup_budget_oos.py derives from the committed raw by the registered rule."""
    from benchmarks import startup_budget_oos as oos
    from orchestrator.plan.closedloop.startup_budget import PREPARE_OVER_PLAN, SERVE_OVER_PLAN, startup_budget

    rule = oos.factors(oos.job_steps() + oos.engine_starts() + oos.r1_h200_cold())
    assert (rule["cold"], rule["warm"]) == (PREPARE_OVER_PLAN, SERVE_OVER_PLAN)
    assert main(["jobscript", "--scheduler", "slurm", "--config", QWEN3_PRESET, "--then", "serve+goodput",
                 "--set", "engine.kind=sglang"]) == 0
    captured = capsys.readouterr()
    b = startup_budget(load_config(QWEN3_PRESET, ["engine.kind=sglang"]))
    budget = 28.5 + b.prepare_plan_s * PREPARE_OVER_PLAN + b.warm_plan_s * SERVE_OVER_PLAN
    assert f"start-up budget {budget:.0f} s (Ray bring-up 28.5 s measured + plan on H100-SXM: prepare " \
           f"{b.prepare_plan_s:.0f} s (time to ready {b.cold_plan_s:.0f} s cold + warm-up {b.prepare_warmup_s:.1f} s + " \
           f"stop 22 s) x {PREPARE_OVER_PLAN:.2f} + serve {b.warm_plan_s:.0f} s warm x {SERVE_OVER_PLAN:.2f}" \
        in captured.err, captured.err
    assert f"PDO_READY_TIMEOUT_S=${{PDO_READY_TIMEOUT_S:-{budget:.0f}}}" in captured.out
    # another GPU's prediction moves the budget with it (not a constant)
    assert main(["jobscript", "--scheduler", "slurm", "--config", QWEN3_PRESET, "--then", "serve+goodput",
                 "--set", "engine.kind=sglang", "--set", "cluster.gpu=H200"]) == 0
    assert f"start-up budget {budget:.0f} s" not in capsys.readouterr().err


def test_each_aiperf_run_is_sized_from_its_concurrency_and_plans_throughput_scaled_by_the_measured_runs():
    """serve+goodput's AIPerf allowance per declared N: AIPerf's own start-up at the command's 12,800 dataset entries +
    warm-up + window + the two waits for the N requests in flight when each ends (N x OSL / plan's output tok/s at N,
    Little's law; at most the grace), times the worst measured/predicted of the one-H100 lease's six AIPerf runs. The
    constants are what benchmarks/aiperf_allowance.py reads from the lease's and this VM's raw files."""
    from benchmarks import aiperf_allowance as raw
    from orchestrator.cli import jobscript as cli
    from orchestrator.plan.closedloop.predict import predict_closed_loop

    runs, start_s, dataset_s = raw.ratios()
    assert len(runs) == 6 and raw.worst_ratio(runs) == cli.AIPERF_OVER_PREDICTED
    assert round(start_s, 2) == cli.AIPERF_START_S and dataset_s == cli.AIPERF_DATASET_S
    assert cli.AIPERF_DATASET_GROWTH == (256, 12800, round(raw.local_dataset_growth()[0], 2))
    assert cli.aiperf_start_s(256) == cli.AIPERF_START_S < cli.aiperf_start_s(12800)
    cfg = load_config(QWEN3_PRESET, ["engine.kind=sglang", "benchmark.concurrency=[8,64]"])
    allowance, how = cli.aiperf_allowance(cfg)
    b = cfg.benchmark
    for (n, seconds), point in zip(allowance, predict_closed_loop(cfg, [8, 64]).points):
        wait_s = min(b.grace_s, n * b.output_tokens / point.output_tok_s)
        assert n == point.concurrency and 0 < wait_s < b.grace_s, (n, wait_s)
        assert seconds == round((cli.aiperf_start_s(12800) + b.warmup_s + b.window_s + 2 * wait_s)
                                * cli.AIPERF_OVER_PREDICTED)
    assert f"AIPerf start {cli.aiperf_start_s(12800):.0f} s at 12800 entries" in how and "x 1.05" in how
    # a wait longer than the grace is cut there, as AIPerf cuts it
    assert aiperf_phases_s(60, 120, 30, concurrency=64, output_tokens=200, output_tok_s=100) == 60 + 120 + 2 * 30

