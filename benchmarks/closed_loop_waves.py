"""Do closed-loop clients move in waves, and what would keep them together? Measured runs beside the planner (issue 25).

    .venv/bin/python benchmarks/closed_loop_waves.py [--aiperf-site DIR]

Read, not fitted; nothing here changes the model. Four parts:
1. AIPerf 0.12's closed-loop client, from its installed source (`--aiperf-site`, the `aiperf` package folder; skipped
   when absent): how a `--concurrency N` phase issues credits, whether the warm-up hands over to the measured phase with
   requests in flight, whether a ramp applies without its flag. Printed as file:line and the line itself.
2. Our five closed-loop runs of the six-layer Qwen3 model (qwen3_closed_loop_terms.RUNS): the measured phase's first
   send instant (how many of the N requests leave within 5 ms of the first), how the later sends group, and the decode
   server's `#running-req` over the window (min, max, coefficient of variation of its one-per-40-steps lines) beside
   the planner's decode batch sampled the same way (every 40th decode forward of each decode server, from 10 s into
   the window to its end).
3. The organisers' N = 32 run (published lines copied in 2026-11-27-organisers-n32-waves/): prefill-0's bursts (lines
   separated by >= 2 s of whole-second stamps) with the requests each carried (new tokens / 3,991, their prompt),
   and decode-0's step (40 steps over the gen-throughput interval) at equal #running-req with and without
   requests in transfer.
4. The planner given a wave: a synchronised burst of k requests per prefill server (k = the bursts of part 3) on
   configs/qwen3-pd-2026.yaml, TTFT p50 of the burst, beside the closed loop's steady state at N = 32, how its first
   wave's ends spread against its first tokens, and prefill-0's longest idle gap.
5. What-ifs, not the model (each a mechanism read from SGLang's source, swapped into the planner's loop here only):
   a. sglang-router's mini_lb picks a uniformly random prefill and decode per request (the organisers' router;
      ../shared/notes/sglang-pd-protocol.md, "MiniLB logic") where the planner goes round robin; five seeds.
   b. SGLang's NIXL sender puts every room bound for one decode port on one of its transfer workers
      (`sum(dst_port) % queues`) and posts one descriptor per page per layer per K/V (page size 1: 2 x 94 x 4,000 per
      request for Qwen3-235B): each (prefill, decode) pair's transfers in one line, at the per-descriptor cost NIXL
      took on one busy H100 over cuda_ipc (10-17 ms for ~33,000 descriptors: 2026-11-24-kv-transfer-h100-s5, the
      only committed figure; InfiniBand's is not measured). Round robin pairs prefill i with decode i, so b alone
      uses two of the four lines; a + b uses all four, as the organisers' stack did.
6. Where a wave is lost and regained, stage by stage, in the three one-H100 runs with our NIXL patch (the per-request
   wall times qwen3_ttft_breakdown.py reads: send, prefill scheduled, forward done, KV enqueued after the hold, the
   transfer worker's pop, NIXL done, the decode seeing it, first token, end): per stage, its events of the measured
   window (5 s trimmed at each edge) counted per 0.5 s, and the coefficient of variation of those counts (about 0
   when they are paced, higher in waves). Beside them the planner's own run of that config and N, its stages read through a wrapper that records
   when each request's KV is sent (it calls the planner's own send_kv unchanged).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from datetime import datetime
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.qwen3_closed_loop_terms import RUNS, read_archive  # noqa: E402
from orchestrator.config import load_config  # noqa: E402
from orchestrator.perfmodel.costmodel import cost_model_for  # noqa: E402
from orchestrator.plan.closedloop.client import ClosedLoopLoad, simulate_closed_loop  # noqa: E402
from orchestrator.perfmodel.scheduling.limits import Seq  # noqa: E402
from orchestrator.plan.simulation.simulate import Simulation, simulate_run  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
ORGANISERS = RESULTS / "2026-11-27-organisers-n32-waves" / "organisers-n32-log-lines.json"
ORGANISERS_PROMPT = 3991  # prefill-0's lone-prompt lines (#new-token of a one-request forward)
ORGANISERS_TTFT_P50_MS = 1071  # their AIPerf summary at N = 32 (2026-11-26-qwen3-closed-loop-plan/organisers-h100-measured.json)
QWEN_2026 = "configs/qwen3-pd-2026.yaml"
LOG_INTERVAL = 40  # SGLang's --decode-log-interval default
SAME_INSTANT_S = 0.005
BURST_GAP_S = 2.0
ORGANISERS_MEASURED = {24: (834.66, 17.831, 1068.41), 32: (1070.75, 18.956, 1292.06), 48: (1495.15, 20.360, 1643.73),
                       64: (2250.20, 21.265, 1909.85)}  # TTFT p50 ms, ITL p50 ms, out tok/s (closed_loop.yaml rows)
NIXL_S_PER_DESCRIPTOR = (10e-3 / 33_000, 17e-3 / 33_000)  # one busy H100, cuda_ipc (docs/performance.md)

# (file under aiperf/, a substring of the line that states the fact, what it means for the closed loop)
AIPERF_FACTS = [
    ("timing/config.py", "PhaseType.CONCURRENCY: ArrivalPattern.CONCURRENCY_BURST",
     "a --concurrency phase has no inter-arrival interval: a credit is issued whenever a slot is free"),
    ("timing/config.py", "seamless=False,",
     "the warm-up phase is not seamless: the measured phase starts after every warm-up request returned, "
     "so it opens with all N sent at once"),
    ("timing/phase/runner.py", "if config.concurrency_ramp_duration_sec and config.concurrency:",
     "a concurrency ramp exists only with --concurrency-ramp-duration (the contest's command has none)"),
]


def aiperf_facts(site: Path) -> list[str]:
    out = []
    for rel, needle, meaning in AIPERF_FACTS:
        path = site / rel
        lines = path.read_text().splitlines() if path.exists() else []
        hits = [i for i, line in enumerate(lines, 1) if needle in line]
        where = f"aiperf/{rel}:{hits[0]}" if hits else f"aiperf/{rel}: NOT FOUND"
        out.append(f"  {where}: `{needle}` -> {meaning}")
    return out


def send_groups(sends: list[float]) -> list[int]:
    """Sizes of the runs of sends each within SAME_INSTANT_S of the previous one, in send order."""
    groups = [1] if sends else []
    for a, b in zip(sends, sends[1:]):
        if b - a < SAME_INSTANT_S:
            groups[-1] += 1
        else:
            groups.append(1)
    return groups


def spread(values: list[int]) -> str:
    mean = statistics.fmean(values)
    return f"{min(values)}..{max(values)} (mean {mean:.1f}, CV {statistics.pstdev(values) / mean:.2f})"


def measured_runs() -> list[tuple[str, int, str, str]]:
    print("\n2. Our closed-loop runs (AIPerf records + decode-0's lines) beside the planner at the same config and N")
    print(f"{'run':<27}{'N':>3} {'first send':>10} {'later send groups':>18}  {'decode #running-req (measured)':<34}"
          f"{'planner decode batch':<30}{'TTFT p50 meas / model':>22}")
    seen = []
    for label, rel, folder, config, gpu, _, _ in RUNS:
        records, lines = read_archive(rel, folder)
        for n in sorted(records):
            window = [r for r in records[n] if r["metadata"]["benchmark_phase"] == "profiling"]
            sends = sorted(r["metadata"]["request_start_ns"] / 1e9 for r in window)
            ends = max(r["metadata"]["request_end_ns"] / 1e9 for r in window)
            groups = send_groups(sends)
            running = [run for t, run in lines if sends[0] + 10 <= t < ends - 1]
            ttft = statistics.median(r["metrics"]["time_to_first_token"]["value"] for r in window)
            model_batch, model_ttft = planner_batches(config, gpu, n)
            print(f"{label:<27}{n:>3} {groups[0]:>10} {statistics.fmean(groups[1:]):>18.2f}  {spread(running):<34}"
                  f"{spread(model_batch):<30}{ttft:>11,.0f} / {model_ttft:,.0f}")
            seen.append((label, n, config, gpu))
    return seen


def planner_batches(config: str, gpu: str, n: int) -> tuple[list[int], float]:
    """The planner's decode batch every 40th decode forward of each decode server (10 s into the window to its end),
    and its TTFT p50."""
    cfg = load_config(ROOT / config, paths_from=ROOT)
    forwards: dict[str, list[tuple[float, int]]] = {}

    def observe(now, server, forward, _schedule):
        if forward.kind == "decode":
            forwards.setdefault(server, []).append((now, len(forward.running)))

    run = simulate_closed_loop(cfg, ClosedLoopLoad.of(cfg, n), gpu=gpu, observe=observe)
    window_s = cfg.benchmark.window_s
    batches = [b for steps in forwards.values() for t, b in steps[::LOG_INTERVAL] if 10 <= t < window_s]
    return batches, run.ttft_ms()["p50"]


def organisers() -> list[int]:
    raw = json.loads(ORGANISERS.read_text())

    def stamp(t: str) -> float:
        return datetime.fromisoformat("2026-10-09 " + t + "+00:00").timestamp()

    print(f"\n3. The organisers' N = 32 run ({ORGANISERS.relative_to(ROOT)})")
    lines = raw["prefill_lines"]
    bursts: list[list[list]] = [[lines[0]]]
    for before, line in zip(lines, lines[1:]):
        if stamp(line[0]) - stamp(before[0]) >= BURST_GAP_S:
            bursts.append([])
        bursts[-1].append(line)
    sizes = []
    for i, burst in enumerate(bursts):
        requests = round(sum(line[2] for line in burst) / ORGANISERS_PROMPT)
        lone = sum(1 for line in burst if line[1] == 1 and line[2] >= ORGANISERS_PROMPT - 1)
        edge = " (the copied lines start or end inside it: a lower bound)" if i in (0, len(bursts) - 1) else ""
        print(f"  prefill-0 burst {burst[0][0]}-{burst[-1][0]}: {len(burst)} forwards, {requests} requests, #new-seq "
              f"{[line[1] for line in burst]} ({lone} lone-prompt forwards, #queue-req <= "
              f"{max(line[3] for line in burst)}){edge}")
        if not edge:
            sizes.append(requests)
    steps: dict[tuple[int, bool], list[float]] = {}
    for _, running, transfer, tok_s in raw["decode_lines"]:
        steps.setdefault((running, transfer > 0), []).append(running / tok_s * 1e3)
    pairs = sorted(r for r, busy in steps if busy and (r, False) in steps)
    print("  decode-0's step at equal #running-req, requests in transfer vs none (ms, running / gen throughput):")
    for running in pairs:
        with_, without = statistics.fmean(steps[(running, True)]), statistics.fmean(steps[(running, False)])
        print(f"    #running-req {running:>2}: {with_:5.1f} with #transfer-req > 0, {without:5.1f} with none "
              f"({with_ / without - 1:+.0%})")
    return sizes


def planner_given_waves(sizes: list[int]) -> None:
    cfg = load_config(ROOT / QWEN_2026, paths_from=ROOT)
    prefills = sum(g.count for role, _, g in cfg.layout.groups() if role == "prefill")
    print(f"\n4. The planner given a wave ({QWEN_2026}, {cfg.layout.describe()}; TTFT in ms)")
    for k in sorted(set(sizes)):
        run = simulate_run(cfg, [(cfg.benchmark.input_tokens, cfg.benchmark.output_tokens)] * (k * prefills),
                           max_concurrency=None)
        ttft = sorted(t * 1e3 for t in run.ttft_s)
        print(f"  {k} requests per prefill server sent at once: TTFT p50 {statistics.median(ttft):,.0f} "
              f"(first {ttft[0]:,.0f}, last {ttft[-1]:,.0f})")
    forwards: list[tuple[float, float]] = []
    batches: list[tuple[float, int]] = []

    def observe(now, server, forward, _schedule):
        if server == "prefill-0-0":
            forwards.append((now, now + forward.duration_s))
        elif server == "decode-0-0" and forward.kind == "decode":
            batches.append((now, len(forward.running)))

    steady = simulate_closed_loop(cfg, ClosedLoopLoad.of(cfg, 32), observe=observe)
    groups = [len(w) for w in steady.waves()]
    print(f"  the closed loop at N = 32: TTFT p50 {steady.ttft_ms()['p50']:,.0f} (its first wave of {groups[0]} "
          f"{statistics.median(r.ttft_s for r in steady.waves()[0]) * 1e3:,.0f}; later send groups "
          f"{statistics.fmean(groups[1:]):.1f}); measured {ORGANISERS_TTFT_P50_MS:,}")
    first = steady.waves()[0]
    joins, ends = sorted(r.first_token_s for r in first), sorted(r.end_s for r in first)
    during = [b for t, b in batches if ends[0] <= t <= ends[-1]]
    print(f"  its first wave: first tokens spread over {joins[-1] - joins[0]:.2f} s, ends over {ends[-1] - ends[0]:.2f} s "
          f"(decode-0's batch while they end: {min(during)}..{max(during)}: the early ones are back within a lone "
          "prefill and keep the batch full)")
    idle = [b - a for (_, a), (b, _) in zip(forwards, forwards[1:]) if 20 <= b <= steady.load.window_s]
    print(f"  prefill-0 from 20 s to the window's end: longest idle gap {max(idle):.2f} s (measured bursts: 2-4 s idle "
          "between them)")


def random_pairs(seed: int):
    """Simulation.arrive with mini_lb's pair choice: a uniformly random prefill and decode per request."""
    rng = random.Random(seed)

    def arrive(self: Simulation, req) -> None:
        req.arrival_s = self.now
        req.seq = Seq(req.prompt_len, req.output_len, owner=req)
        req.decode, req.prefill = rng.choice(self.decode), rng.choice(self.prefill)
        req.prefill_seq = Seq(req.prompt_len, 1, owner=req)
        req.decode.steps.enqueue_prealloc(req.seq)
        self.kick(req.decode)
    return arrive


def one_transfer_line_per_pair(seconds_per_descriptor: float, layers: int):
    """Simulation.send_kv with one FIFO transfer worker per (prefill, decode) pair, a request's time its descriptors'."""
    def send_kv(self: Simulation, prefill, req) -> None:
        free: dict[tuple[str, str], float] = self.__dict__.setdefault("transfer_line_free_s", {})  # per simulation
        pair = (prefill.name, req.decode.name)
        start = max(self.now, free.get(pair, 0.0))
        free[pair] = start + req.prompt_len * 2 * layers * seconds_per_descriptor
        self.at(free[pair], self.kv_landed, prefill, req.decode, req)
    return send_kv


def what_ifs() -> None:
    cfg = load_config(ROOT / QWEN_2026, paths_from=ROOT)
    _, _, group = next(g for g in cfg.layout.groups() if g[0] == "prefill")
    layers = cost_model_for(cfg, "prefill", group).arch.num_hidden_layers

    def point(n: int) -> tuple[float, float, float, str]:
        batches: list[tuple[float, int]] = []

        def observe(now, server, forward, _schedule):
            if server == "decode-0-0" and forward.kind == "decode":
                batches.append((now, len(forward.running)))

        run = simulate_closed_loop(cfg, ClosedLoopLoad.of(cfg, n), observe=observe)
        sampled = [b for t, b in batches[::LOG_INTERVAL] if 10 <= t < cfg.benchmark.window_s]
        batch = f"{min(sampled)}..{max(sampled)}" if sampled else f"{len(batches)} steps"
        return run.ttft_ms()["p50"], run.itl_ms()["p50"], run.output_tok_s, batch

    def row(label: str, points: list[tuple[float, float, float, str]]) -> None:
        cells = "  ".join(f"{t:>5,.0f} {i:>4.1f} {o:>5,.0f} {b:>6}" for t, i, o, b in points)
        print(f"  {label:<52}{cells}")

    print(f"\n5. What-ifs on {QWEN_2026}, not the model (TTFT p50 ms, ITL p50 ms, out tok/s, decode-0's batch every 40 steps)")
    print(f"  {'':<52}" + "  ".join(f"{'N = ' + str(n):<24}" for n in ORGANISERS_MEASURED))
    row("measured (the organisers)", [(t, i, o, "4..19" if n == 32 else "") for n, (t, i, o) in ORGANISERS_MEASURED.items()])
    row("the planner (round robin, link-timed transfers)", [point(n) for n in ORGANISERS_MEASURED])
    for seed in range(5):
        with mock.patch.object(Simulation, "arrive", random_pairs(seed)):
            row(f"a. mini_lb's random pairs, seed {seed}", [point(n) for n in ORGANISERS_MEASURED])
    for cost in NIXL_S_PER_DESCRIPTOR:
        with mock.patch.object(Simulation, "send_kv", one_transfer_line_per_pair(cost, layers)):
            row(f"b. one transfer line per pair, {cost * 1e6:.2f} us/descriptor", [point(n) for n in ORGANISERS_MEASURED])
    for cost in NIXL_S_PER_DESCRIPTOR:  # the organisers' stack has both: random pairs fill all four transfer lines
        with mock.patch.object(Simulation, "send_kv", one_transfer_line_per_pair(cost, layers)), \
                mock.patch.object(Simulation, "arrive", random_pairs(0)):
            row(f"a + b, seed 0, {cost * 1e6:.2f} us/descriptor", [point(n) for n in ORGANISERS_MEASURED])


ONE_H100 = RESULTS / "2026-11-26-qwen3-serve-one-h100"
ONE_H100_RUNS = [("call 9", "serve-call9.tar.xz"), ("call 15", "serve-call15.tar.xz"), ("sglang-router", "router-call10.tar.xz")]
ONE_H100_CONFIG, ONE_H100_GPU = "configs/device-h100x1-qwen3-serve.yaml", "H100-SXM"
BIN_S = 0.5  # a tenth of the organisers' ~5.7 s wave period; several of our runs' decodes (~2.4-4.5 s)


def bin_terms(times: list[float]) -> str:
    """CV of the events' counts per BIN_S bin over their span: ~0 paced, higher when they come in waves."""
    if len(times) < 2:
        return f"{'-':<18}"
    bins = [0] * (int((times[-1] - times[0]) / BIN_S) + 1)
    for t in times:
        bins[int((t - times[0]) / BIN_S)] += 1
    return f"{statistics.pstdev(bins) / statistics.fmean(bins):<18.2f}"


def measured_stages(archive: Path, n: int) -> dict[str, list[float]]:
    from benchmarks import qwen3_ttft_breakdown as ttft

    files = ttft.members(archive)
    ready, first, last, seen = ttft.timeline(ttft.one(files, r"prefill[^/]*\.log$"), ttft.one(files, r"decode[^/]*\.log$"))
    window = [r for r in ttft.records(files, n) if r["metadata"]["benchmark_phase"] == "profiling"
              and "time_to_first_token" in r["metrics"]]
    sent = [r["metadata"]["request_start_ns"] / 1e9 for r in window]
    t0, t1 = min(sent) + 5, max(r["metadata"]["request_end_ns"] / 1e9 for r in window) - 5
    rooms = [room for room, t in seen.items() if t0 <= t <= t1]
    batches: dict[float, list[str]] = {}
    for room, done in ready.items():
        if room in first:
            batches.setdefault(done, []).append(room)
    forwards = sorted((min(first[r][0] for r in batch), done) for done, batch in batches.items())
    stages = {"send": sent,
              "prefill scheduled": [first[x][0] for x in rooms if x in first],
              "forward done": [ready[x] for x in rooms if x in ready],
              "KV enqueued": [last[x][0] for x in rooms if x in last],
              "worker pop": [last[x][1] for x in rooms if x in last],
              "KV landed": [seen[x] for x in rooms],
              "first token": [s + r["metrics"]["time_to_first_token"]["value"] / 1e3 for s, r in zip(sent, window)],
              "end": [r["metadata"]["request_end_ns"] / 1e9 for r in window]}
    out = {k: sorted(t for t in v if t0 <= t <= t1) for k, v in stages.items()}
    inside = [x for x in rooms if x in last]
    out["_worker"] = [statistics.median(last[x][1] - last[x][0] for x in inside),
                      statistics.median(last[x][2] - last[x][1] for x in inside)]
    busy = merged_spans([(a, b) for a, b in forwards if t0 <= a <= t1])
    out["_busy"] = [sum(b - a for a, b in busy) / (t1 - t0),
                    statistics.fmean(any(a <= t <= b for a, b in busy) for t in out["worker pop"])]
    return out


def merged_spans(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def planner_stages(n: int) -> dict[str, list[float]]:
    cfg = load_config(ROOT / ONE_H100_CONFIG, paths_from=ROOT)
    started: list[float] = []
    computed: list[float] = []
    sends: list[float] = []
    send_kv = Simulation.send_kv

    def observe(now, _server, forward, _schedule):
        if forward.kind == "prefill":
            started.extend(now for seq, _ in forward.prefill if seq.prefilled == 0)
            computed.extend(now + forward.duration_s for seq, take in forward.prefill if seq.prefilled + take >= seq.fill)

    def recording_send_kv(self: Simulation, prefill, req) -> None:
        sends.append(self.now)
        send_kv(self, prefill, req)

    with mock.patch.object(Simulation, "send_kv", recording_send_kv):
        run = simulate_closed_loop(cfg, ClosedLoopLoad.of(cfg, n), gpu=ONE_H100_GPU, observe=observe)
    t0, t1 = 5.0, run.duration_s - 5
    stages = {"send": [r.sent_s for r in run.requests], "prefill scheduled": started, "forward done": computed,
              "KV enqueued": sends, "first token": [r.first_token_s for r in run.requests],
              "end": [r.end_s for r in run.requests]}
    return {k: sorted(t for t in v if t0 <= t <= t1) for k, v in stages.items()}


def pipeline_stages() -> None:
    print(f"\n6. Stage by stage on one shared H100 ({ONE_H100.relative_to(ROOT)}): CV of each stage's events per "
          f"{BIN_S:g} s over the window (~0: paced; higher: in waves)")
    for n in (4, 16):
        columns = [(label, measured_stages(ONE_H100 / rel, n)) for label, rel in ONE_H100_RUNS]
        columns.append(("planner", planner_stages(n)))
        print(f"  N = {n:<3}{'':<16}" + "".join(f"{label:<18}" for label, _ in columns))
        for stage in [k for k in columns[0][1] if not k.startswith("_")]:
            print(f"    {stage:<18}    " + "".join(bin_terms(stages[stage]) if stage in stages else f"{'(not traced)':<18}"
                                                for _, stages in columns))
        for label, stages in columns[:-1]:
            (queue, nixl), (busy, pops) = stages["_worker"], stages["_busy"]
            print(f"    {label}: the transfer worker's queue p50 {queue * 1e3:.0f} ms, NIXL p50 {nixl * 1e3:.0f} ms; the prefill "
                  f"computes {busy:.0%} of the window, {pops:.0%} of the worker's pops fall inside a forward")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aiperf-site", type=Path, default=None,
                        help="the installed `aiperf` package folder (e.g. .venv-aiperf/lib/python3.11/site-packages/aiperf)")
    args = parser.parse_args(argv)
    print("1. AIPerf's closed-loop client, from its source")
    site = args.aiperf_site
    if site is None or not site.is_dir():
        print("  skipped: no --aiperf-site")
    else:
        version = site.parent / next((p.name for p in site.parent.glob("aiperf-*.dist-info")), "?")
        print(f"  {version.name}")
        print("\n".join(aiperf_facts(site)))
    measured_runs()
    planner_given_waves(organisers())
    what_ifs()
    pipeline_stages()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
