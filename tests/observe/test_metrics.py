"""Router and bench metrics as Prometheus sees them over real HTTP, and the file_sd scrape wiring."""

from __future__ import annotations

import json
import socket
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.config.benchmark import SloConfig, good_request_fraction
from orchestrator.observe.file_sd import (
    ENGINE_JOB,
    TargetFile,
    engine_group,
    exporter_group,
    scrape_address,
    write_targets,
)
from orchestrator.observe.metrics import (
    BENCH_PHASES,
    REQUEST_STATES,
    BenchMetrics,
    RouterMetrics,
    projected_finish,
    start_exporter,
)
from orchestrator.plan.closedloop.client import ClosedLoopLoad, ClosedLoopRun, RequestTiming
from orchestrator.records import RequestResult, WorkerEndpoint

RUN = {"run_id": "r1", "layout": "1PxTP8/1DxTP8"}


def scrape(address: str) -> dict[tuple[str, frozenset], float]:
    """GET /metrics over HTTP -> {(sample name, labels): value}."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples, name: str, **labels) -> float:
    return samples[(name, frozenset({**RUN, **labels}.items()))]


@pytest.fixture
def exporter():
    registry = CollectorRegistry()
    exp = start_exporter("127.0.0.1", 0, registry)
    yield registry, exp
    exp.close()


def ok_result(index: int, prompt: int, completion: int, prefill="prefill-0/0", decode="decode-0/0") -> RequestResult:
    return RequestResult(index=index, status="ok", prompt_len=prompt, output_len=completion,
                         completion_tokens=completion, ttft_s=0.2, e2e_s=1.5, kv_wait_s=0.1,
                         prefill_worker=prefill, decode_worker=decode)


def test_request_states_move_between_gauges(exporter):
    registry, exp = exporter
    router = RouterMetrics(**RUN, registry=registry)
    samples = scrape(exp.address)
    assert all(value(samples, "pdorch_requests_in_flight", state=s) == 0 for s in REQUEST_STATES)
    for _ in range(3):
        router.state_change(None, "queued")
    router.state_change("queued", "prefill")
    router.state_change("prefill", "transferring")
    router.state_change("queued", "decoding")
    router.state_change("decoding", None)
    samples = scrape(exp.address)
    assert {s: value(samples, "pdorch_requests_in_flight", state=s) for s in REQUEST_STATES} == {
        "queued": 1, "prefill": 0, "transferring": 1, "decoding": 0}


def test_unknown_state_is_rejected_with_the_allowed_ones():
    router = RouterMetrics(**RUN)
    with pytest.raises(ValueError, match=r"unknown request state 'sending'.*queued"):
        router.state_change(None, "sending")


def test_completed_requests_count_tokens_per_phase_and_worker(exporter):
    registry, exp = exporter
    router = RouterMetrics(**RUN, registry=registry)
    router.completed(ok_result(0, 100, 10))
    router.completed(ok_result(1, 50, 20, prefill="prefill-1/0"))
    router.completed(RequestResult(index=2, status="failed", prompt_len=70, output_len=5,
                                   error="timeout: decode leg exceeded 30 s"))
    router.failed("http_502")
    router.worker_outstanding("decode", "decode-0/0", 4)
    samples = scrape(exp.address)
    assert value(samples, "pdorch_input_tokens_total", role="prefill", worker="prefill-0/0") == 100
    assert value(samples, "pdorch_input_tokens_total", role="prefill", worker="prefill-1/0") == 50
    assert value(samples, "pdorch_output_tokens_total", role="decode", worker="decode-0/0") == 30
    assert value(samples, "pdorch_requests_completed_total") == 2
    assert value(samples, "pdorch_requests_failed_total", reason="timeout") == 1
    assert value(samples, "pdorch_requests_failed_total", reason="http_502") == 1
    assert value(samples, "pdorch_ttft_seconds_count") == 2
    assert value(samples, "pdorch_e2e_seconds_sum") == pytest.approx(3.0)
    assert value(samples, "pdorch_kv_wait_seconds_bucket", le="0.1") == 2
    assert value(samples, "pdorch_worker_outstanding_requests", role="decode", worker="decode-0/0") == 4


def test_completed_requests_are_judged_against_the_2026_goodput_sla_as_aiperf_does(exporter):
    """ITL = (e2e - TTFT) / (tokens - 1); good = TTFT <= 3 s and ITL <= 20 ms; a request without a TTFT (not
    streamed) or with one token (no ITL) is judged and never good (AIPerf counts both in its request count, not its
    good ones); good output tokens add up the good requests' tokens."""
    registry, exp = exporter
    router = RouterMetrics(**RUN, registry=registry)

    def done(ttft_s, e2e_s, tokens):
        router.completed(RequestResult(index=0, status="ok", prompt_len=10, output_len=tokens,
                                       completion_tokens=tokens, ttft_s=ttft_s, e2e_s=e2e_s,
                                       prefill_worker="prefill-0/0", decode_worker="decode-0/0"))

    done(0.5, 0.5 + 0.019 * 199, 200)  # ITL 19 ms: good
    done(2.9, 2.9 + 0.021 * 199, 200)  # ITL 21 ms: not good
    done(3.1, 3.1 + 0.010 * 99, 100)   # TTFT 3.1 s: not good
    done(0.1, 0.12, 2)                 # ITL 20 ms on the line: good
    done(None, 1.0, 50)                # not streamed: no TTFT, judged, not good
    done(0.2, 0.2, 1)                  # one token: no ITL, judged, not good
    samples = scrape(exp.address)
    assert value(samples, "pdorch_sla_judged_requests_total") == value(samples, "pdorch_sla_attempted_requests_total") == 6
    assert value(samples, "pdorch_sla_good_requests_total") == 2
    assert value(samples, "pdorch_sla_good_output_tokens_total") == 202
    assert value(samples, "pdorch_itl_seconds_count") == 4
    assert value(samples, "pdorch_itl_seconds_bucket", le="0.02") == 3  # 19, 10 and 20 ms; 21 ms is above the line
    assert value(samples, "pdorch_requests_completed_total") == 6


def test_the_good_fraction_counts_failed_and_rejected_requests_but_not_those_whose_client_left(exporter):
    """AIPerf's good_request_fraction is good / (valid + errored): a failure of any reason and a 503 at the gateway are
    error records there, while a request whose client went away (AIPerf cancelling what it holds when its grace period
    ends) leaves no record. The gateway's attempted counter is that denominator."""
    registry, exp = exporter
    router = RouterMetrics(**RUN, registry=registry)
    for ttft_s in (0.5, 0.5, 4.0):  # two good, one over the 3 s TTFT
        router.completed(RequestResult(index=0, status="ok", prompt_len=10, output_len=11, completion_tokens=11,
                                       ttft_s=ttft_s, e2e_s=ttft_s + 0.1, prefill_worker="p", decode_worker="d"))
    router.completed(RequestResult(index=0, status="failed", prompt_len=10, output_len=11, error="timeout: decode"))
    router.completed(RequestResult(index=0, status="failed", prompt_len=10, output_len=11,
                                   error="cut_off: the gateway's drain timed out before the answer ended"))
    router.completed(RequestResult(index=0, status="failed", prompt_len=10, output_len=11,
                                   error="cancelled: the client went away"))
    router.rejected("queue_full")
    router.rejected("stopping")
    samples = scrape(exp.address)
    good, judged = value(samples, "pdorch_sla_good_requests_total"), value(samples, "pdorch_sla_judged_requests_total")
    attempted = value(samples, "pdorch_sla_attempted_requests_total")
    assert (good, judged, attempted) == (2, 3, 3 + 2 + 2)  # the client that left is in neither
    assert good / attempted == good_request_fraction(2, valid=3, errored=4) == pytest.approx(2 / 7)
    assert value(samples, "pdorch_requests_failed_total", reason="cancelled") == 1  # still a failure on the panels


def test_the_good_request_counters_judge_by_the_configs_slo_and_say_it_in_their_help(exporter):
    """A config with another benchmark.slo (here TTFT <= 1 s, ITL <= 50 ms) gets counters that judge by it, as
    `goodput` does (ms compared as ms), not by the 2026 defaults: each request below flips under the other SLO."""
    registry, exp = exporter
    router = RouterMetrics(**RUN, registry=registry, slo=SloConfig(ttft_ms=1000, itl_ms=50))
    for ttft_s, itl_s in ((1.5, 0.010), (0.5, 0.030), (0.9, 0.060)):  # 2026 SLO: good, not good, not good
        router.completed(RequestResult(index=0, status="ok", prompt_len=10, output_len=11, completion_tokens=11,
                                       ttft_s=ttft_s, e2e_s=ttft_s + itl_s * 10,
                                       prefill_worker="prefill-0/0", decode_worker="decode-0/0"))
    samples = scrape(exp.address)
    assert value(samples, "pdorch_sla_judged_requests_total") == 3
    assert value(samples, "pdorch_sla_good_requests_total") == 1  # the 0.5 s / 30 ms one only
    assert value(samples, "pdorch_sla_good_output_tokens_total") == 11
    families = text_string_to_metric_families(generate_latest(registry).decode())
    (help_text,) = [f.documentation for f in families if f.name == "pdorch_sla_good_requests"]
    assert "TTFT <= 1000 ms and ITL <= 50 ms" in help_text


def test_the_gateway_counters_and_the_planner_judge_the_same_requests_the_same_way():
    """One rule (SloConfig.admits on AIPerf's ITL) behind both: the gateway's good-request counter and the planner's
    predicted goodput call the same requests good, the lines themselves (TTFT 2.007 s under a 2007 ms SLO, ITL
    (3.02 - 3.0) s under 20 ms) and a one-token answer included."""
    slo = SloConfig(ttft_ms=2007, itl_ms=20)
    requests = [  # (TTFT s, e2e s, output tokens), the verdict AIPerf gives it
        (2.007, 2.007 + 0.019 * 199, 200, True),    # TTFT on the line
        (2.0070001, 2.1, 200, False),               # TTFT just over
        (1.0, 1.0 + 0.020 * 199, 200, True),        # ITL on the line
        (3.0 - 1.0, 3.02 - 1.0, 2, True),           # ITL on the line, two tokens
        (1.0, 1.0 + 0.0200001 * 199, 200, False),   # ITL just over
        (0.2, 0.2, 1, False),                       # one token: no ITL
    ]
    registry = CollectorRegistry()
    router = RouterMetrics(**RUN, registry=registry, slo=slo)
    gateway = []
    for ttft_s, e2e_s, tokens, _ in requests:
        before = registry.get_sample_value("pdorch_sla_good_requests_total", RUN) or 0
        router.completed(RequestResult(index=0, status="ok", prompt_len=10, output_len=tokens, completion_tokens=tokens,
                                       ttft_s=ttft_s, e2e_s=e2e_s, prefill_worker="p", decode_worker="d"))
        gateway.append(registry.get_sample_value("pdorch_sla_good_requests_total", RUN) == before + 1)
    timings = [RequestTiming(0.0, ttft_s, e2e_s, tokens) for ttft_s, e2e_s, tokens, _ in requests]
    run = ClosedLoopRun(ClosedLoopLoad(len(requests), 10, 200, 120, 30), timings, not_counted=0)
    planner = [t in run.good(slo) for t in timings]
    assert gateway == planner == [verdict for *_, verdict in requests]
    assert registry.get_sample_value("pdorch_sla_judged_requests_total", RUN) == len(requests)


def test_gateway_rejections_start_at_zero_per_reason(exporter):
    """So a serving dashboard's rejection panels show 0, not nothing, before the first 503."""
    registry, exp = exporter
    router = RouterMetrics(**RUN, registry=registry)
    router.rejected("stopping")
    samples = scrape(exp.address)
    assert value(samples, "pdorch_requests_rejected_total", reason="queue_full") == 0
    assert value(samples, "pdorch_requests_rejected_total", reason="stopping") == 1


def test_aggregated_requests_count_on_the_aggregated_worker():
    router = RouterMetrics(run_id="r1", layout="agg:1AxTP16")
    router.completed(ok_result(0, 40, 8, prefill=None, decode="aggregated-0/0"))
    labels = {"run_id": "r1", "layout": "agg:1AxTP16", "role": "aggregated", "worker": "aggregated-0/0"}
    assert router.registry.get_sample_value("pdorch_input_tokens_total", labels) == 40
    assert router.registry.get_sample_value("pdorch_output_tokens_total", labels) == 8


def test_bench_phase_has_exactly_one_current_and_a_timeline(exporter):
    registry, exp = exporter
    bench = BenchMetrics(**RUN, deadline_s=420, registry=registry, started_at=time.time() - 10)
    for name in ("placement", "engine_start", "run"):
        bench.phase(name)
    samples = scrape(exp.address)
    assert {p: value(samples, "pdorch_phase", phase=p) for p in BENCH_PHASES} == {
        p: (1.0 if p == "run" else 0.0) for p in BENCH_PHASES}
    assert value(samples, "pdorch_deadline_seconds") == 420
    assert value(samples, "pdorch_elapsed_seconds") >= 10  # live: computed at scrape time
    timeline = bench.timeline_dicts()
    assert [p["name"] for p in timeline] == ["placement", "engine_start", "run"]
    assert timeline[0]["end_s"] == timeline[1]["start_s"] and timeline[-1]["end_s"] is None
    with pytest.raises(ValueError, match=r"unknown bench phase 'load'.*engine_start"):
        bench.phase("load")


def test_progress_sets_gauges_and_projects_the_finish(exporter):
    registry, exp = exporter
    bench = BenchMetrics(**RUN, deadline_s=420, registry=registry)
    assert bench.progress(0, 10, 0, 1000) is None  # no rate yet
    projected = bench.progress(5, 10, 500, 1000, projected_finish_s=300.0)
    assert projected == 300.0
    samples = scrape(exp.address)
    assert value(samples, "pdorch_projected_finish_seconds") == 300
    assert value(samples, "pdorch_bench_done_prompts") == 5
    assert value(samples, "pdorch_bench_planned_prompts") == 10
    assert value(samples, "pdorch_bench_done_output_tokens") == 500
    assert value(samples, "pdorch_bench_planned_output_tokens") == 1000


def test_projected_finish_is_elapsed_plus_remaining_at_the_run_rate():
    # run began at 100 s; 60 s later 600 of 1800 tokens are done -> 10 tok/s -> 120 s more
    assert projected_finish(160, 100, 600, 1800) == pytest.approx(280)
    assert projected_finish(160, 100, 1800, 1800) == 160
    assert projected_finish(160, None, 600, 1800) is None


def test_taken_exporter_port_falls_back_to_a_free_one():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        taken = sock.getsockname()[1]
        exp = start_exporter("127.0.0.1", taken, CollectorRegistry())
        try:
            assert exp.port not in (taken, 0)
            assert isinstance(scrape(exp.address), dict)
        finally:
            exp.close()


def test_write_targets_replaces_the_file_and_validates(tmp_path):
    path = tmp_path / "sd" / "targets.json"
    groups = [exporter_group("r1", "10.0.0.5:9464", "driver")]
    write_targets(path, groups)
    assert json.loads(path.read_text()) == groups
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    with pytest.raises(ValueError, match=r"groups\[0\].targets must be a list of 'host:port'"):
        write_targets(path, [{"targets": ["no-port"], "labels": {}}])
    with pytest.raises(ValueError, match=r"groups\[0\].labels must map strings to strings"):
        write_targets(path, [{"targets": ["h:1"], "labels": {"n": 1}}])
    assert json.loads(path.read_text()) == groups  # a rejected write leaves the last good file
    assert [p.name for p in path.parent.iterdir()] == ["targets.json"]  # no temp files left behind


def test_engine_group_scrapes_the_worker_url_with_its_labels():
    endpoint = WorkerEndpoint(role="prefill", name="prefill-0/1", url="http://10.0.0.7:30001")
    assert engine_group("r1", endpoint) == {
        "targets": ["10.0.0.7:30001"],
        "labels": {"job": ENGINE_JOB, "run_id": "r1", "role": "prefill", "worker": "prefill-0/1"},
    }
    with pytest.raises(ValueError, match="prefill-0/1.*no host:port"):
        engine_group("r1", WorkerEndpoint(role="prefill", name="prefill-0/1", url="http://10.0.0.7"))


def test_scrape_address_uses_the_node_ip_for_wildcard_binds():
    assert scrape_address("0.0.0.0", 9464, "10.0.0.9") == "10.0.0.9:9464"
    assert scrape_address("127.0.0.1", 9464, "10.0.0.9") == "127.0.0.1:9464"


def test_target_file_follows_adds_and_removals(tmp_path):
    path = tmp_path / "targets.json"
    targets = TargetFile(path)
    assert json.loads(path.read_text()) == []
    targets.set("exporter/driver", exporter_group("r1", "127.0.0.1:1", "driver"))
    targets.replace_prefix("engine/", {
        "engine/p": engine_group("r1", WorkerEndpoint(role="prefill", name="p", url="http://127.0.0.1:2")),
        "engine/d": engine_group("r1", WorkerEndpoint(role="decode", name="d", url="http://127.0.0.1:3")),
    })
    assert sorted(t for g in json.loads(path.read_text()) for t in g["targets"]) == [
        "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
    targets.replace_prefix("engine/", {
        "engine/d": engine_group("r1", WorkerEndpoint(role="decode", name="d", url="http://127.0.0.1:3"))})
    targets.remove("exporter/driver")
    assert [g["targets"] for g in json.loads(path.read_text())] == [["127.0.0.1:3"]]


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.1)  # polling interval
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.mark.ray
def test_scrape_targets_actor_follows_the_worker_registry_and_exporters(ray_driver, tmp_path):
    import ray

    from orchestrator.cluster.registry import get_registry
    from orchestrator.config import MetricsConfig
    from orchestrator.observe.file_sd import register_exporter, serve_metrics, start_scrape_targets

    path = tmp_path / "targets.json"
    actor = start_scrape_targets(path, "r1", poll_interval_s=0.2)
    registry = get_registry()
    try:
        ray.get(registry.clear.remote())
        endpoint = WorkerEndpoint(role="decode", name="decode-0/0", url="http://127.0.0.1:31000")
        ray.get(registry.register.remote(endpoint))

        def listed() -> list[str]:
            return sorted(t for g in ray.get(actor.groups.remote()) for t in g["targets"])

        _wait_for(lambda: listed() == ["127.0.0.1:31000"], 30, "the registered engine in the file_sd")

        @ray.remote(num_cpus=0)
        def router_replica() -> str:  # another process of the run starts and announces its exporter
            router = RouterMetrics(**RUN)
            exporter = serve_metrics(router.registry, "router-0", "r1", MetricsConfig(), port=0)
            return exporter.address

        router_address = ray.get(router_replica.remote())
        assert listed() == sorted(["127.0.0.1:31000", router_address])
        assert sorted(t for g in json.loads(path.read_text()) for t in g["targets"]) == listed()
        register_exporter("driver", exporter_group("r1", "127.0.0.1:31002", "driver"))
        assert "127.0.0.1:31002" in listed()

        ray.get(registry.unregister.remote("decode-0/0"))
        _wait_for(lambda: "127.0.0.1:31000" not in listed(), 30, "the stopped engine to leave the file_sd")
    finally:
        ray.get(actor.stop.remote())
        ray.kill(actor)
        ray.get(registry.clear.remote())


def test_failure_counters_start_at_zero_for_every_reason_the_router_can_give():
    """A run without failures shows 0 per reason on the dashboard, not an empty panel; the reasons are the
    first words of the router's error messages, so every kind its code raises must be among them."""
    import re
    from pathlib import Path

    from orchestrator.observe.metrics import KNOWN_FAILURE_REASONS
    from orchestrator.router.dispatch import failures

    exporter = start_exporter("127.0.0.1", 0, RouterMetrics(**RUN).registry)
    try:
        samples = scrape(exporter.address)
    finally:
        exporter.close()
    for reason in KNOWN_FAILURE_REASONS:
        assert samples[("pdorch_requests_failed_total", frozenset({**RUN, "reason": reason}.items()))] == 0
    source = "\n".join(p.read_text() for p in Path(failures.__file__).parent.glob("*.py"))
    raised = set(re.findall(r'LegFailure\("(\w+)"', source)) | set(re.findall(r'DispatchError\(\s*f?"(\w+): ', source))
    assert raised and raised <= set(KNOWN_FAILURE_REASONS), raised - set(KNOWN_FAILURE_REASONS)


def test_every_exported_metric_is_in_the_docs_table():
    """A user reads docs/observability.md's tables to write queries: each metric our exporters serve is a row there,
    with its type (pdorch_requests_rejected_total was served and in no table)."""
    from pathlib import Path

    rows = {}
    for line in (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text().splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 3 and cells[1].startswith("`pdorch_"):
            for name in cells[1].replace("`", "").split(" / "):
                rows[name] = cells[2]
    for metrics in (RouterMetrics("run", "1PxTP8/1DxTP8"), BenchMetrics("run", "1PxTP8/1DxTP8", 420)):
        for family in metrics.registry.collect():
            name = family.name + ("_total" if family.type == "counter" else "")
            assert rows.get(name) == family.type, (name, family.type, rows.get(name))
