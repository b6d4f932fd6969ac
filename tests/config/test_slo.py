"""SloConfig.admits and inter_token_latency_s: the one rule for "a good request", AIPerf 0.12.0's --goodput rule.

The gateway's SLA counters (observe/metrics.py) and the planner's predicted goodput (plan/closedloop/client.py) both
judge by these two; the last test runs AIPerf's own metric classes (from .venv-aiperf) on the same requests.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from orchestrator.api.client import StreamedRequest, summarize
from orchestrator.config.benchmark import SloConfig, inter_token_latency_s
from orchestrator.observe.report import tpot_s
from orchestrator.plan.closedloop.client import RequestTiming
from orchestrator.run.aiperf import aiperf_env, find_aiperf

NS = 1e-9


def test_a_request_exactly_on_the_line_is_good_and_one_nanosecond_over_is_not():
    """The case that decides the comparison: TTFT exactly 2007 ms under a 2007 ms SLO. AIPerf compares integer ns with
    2007 x 1e6 and calls it good; times in seconds scaled to ms (2.007 x 1e3 = 2007.0000000000002) would not."""
    slo = SloConfig(ttft_ms=2007, itl_ms=20)
    assert 2.007 * 1e3 > 2007  # the float trap the rule avoids
    assert slo.admits(2.007, 0.020)
    assert not slo.admits(2.007 + NS, 0.020)
    assert not slo.admits(2.007, 0.020 + NS)
    assert slo.admits(2.007 - NS, 0.020 - NS)


def test_itl_is_aiperfs_and_a_one_token_answer_has_none_so_is_never_good():
    assert inter_token_latency_s(0.5, 0.5 + 0.019 * 199, 200) == pytest.approx(0.019)
    assert inter_token_latency_s(0.2, 0.2, 1) is None  # AIPerf: "Output sequence length must be at least 2"
    assert not SloConfig().admits(0.2, None)  # AIPerf counts it as a request, never as a good one


def test_itl_on_the_line_stays_on_it():
    """(3.02 - 3.0) s is 0.020000000000000018 in floats; in whole ns, as AIPerf measures, it is 20 ms exactly."""
    assert 3.02 - 3.0 > 0.020
    itl = inter_token_latency_s(3.0, 3.02, 2)
    assert itl == 0.020 and SloConfig().admits(3.0, itl)


# AIPerf's own judge: its ITL metric, then its good-request counter, on records of integer ns as it measures them
AIPERF_JUDGE = """
import json, sys
from aiperf.common.exceptions import NoMetricValue
from aiperf.metrics.metric_dicts import MetricRecordDict
from aiperf.metrics.types.good_request_count_metric import GoodRequestCountMetric
from aiperf.metrics.types.inter_token_latency_metric import InterTokenLatencyMetric
from aiperf.metrics.types.output_sequence_length_metric import OutputSequenceLengthMetric
from aiperf.metrics.types.request_latency_metric import RequestLatencyMetric
from aiperf.metrics.types.ttft_metric import TTFTMetric
def parse(metric, d):  # BaseRecordMetric.parse_record on a valid record (no ParsedResponseRecord needed past that)
    metric._check_metrics(d)
    return metric._parse_record(None, d)
verdicts = []
for (ttft_ms, itl_ms), records in json.load(sys.stdin):
    GoodRequestCountMetric.set_slos({"time_to_first_token": ttft_ms, "inter_token_latency": itl_ms})
    good, itl = GoodRequestCountMetric(), InterTokenLatencyMetric()
    for ttft_ns, latency_ns, osl in records:
        d = MetricRecordDict({TTFTMetric.tag: ttft_ns, RequestLatencyMetric.tag: latency_ns,
                              OutputSequenceLengthMetric.tag: osl})
        try:
            d[InterTokenLatencyMetric.tag] = parse(itl, d)
        except NoMetricValue:  # OSL 1: AIPerf's record processor records no ITL and goes on
            pass
        try:
            verdicts.append(parse(good, d) == 1)
        except NoMetricValue:  # no ITL to judge: the processor skips the counter, so the request is not good
            verdicts.append(False)
print(json.dumps(verdicts))
"""


def boundary_records(ttft_ms: float, itl_ms: float) -> list[tuple[int, int, int]]:
    """(TTFT ns, request latency ns, output tokens) on, 1 ns over and 1 ns under each line, for OSL 1, 2 and 200."""
    ttft_ns, itl_ns = round(ttft_ms * 1e6), round(itl_ms * 1e6)
    out = []
    for osl in (1, 2, 200):
        for dt in (-1, 0, 1):
            for di in (-1, 0, 1):  # di: ns over the ITL line per token gap, spread over the whole answer
                out.append((ttft_ns + dt, ttft_ns + dt + max(osl - 1, 0) * itl_ns + di, osl))
    return out


def test_admits_agrees_with_aiperfs_own_goodput_judge_on_every_boundary_request():
    slos = [(3000, 20), (2007, 7), (1000, 50), (250, 33)]
    cases = [[slo, boundary_records(*slo)] for slo in slos]
    tool = find_aiperf()
    out = subprocess.run([str(tool.exe.parent / "python"), "-c", AIPERF_JUDGE], input=json.dumps(cases),
                         capture_output=True, text=True, env=aiperf_env(os.environ), timeout=120)
    assert out.returncode == 0, out.stderr
    aiperf = json.loads(out.stdout)
    ours = [SloConfig(ttft_ms=t, itl_ms=i).admits(ttft_ns / 1e9, inter_token_latency_s(ttft_ns / 1e9, lat_ns / 1e9, osl))
            for (t, i), records in cases for ttft_ns, lat_ns, osl in records]
    assert ours == aiperf
    assert 0 < sum(ours) < len(ours)  # both verdicts occur


def test_every_itl_reader_uses_the_one_definition():
    """bench's report TPOT, the sweep client's TPOT and the planner's ITL all give a request on the 20 ms line
    (TTFT 3.0 s, e2e 3.02 s, 2 tokens) exactly 20 ms, as inter_token_latency_s does and the float formula does not;
    below 2 tokens none has a value."""
    on_line = inter_token_latency_s(3.0, 3.02, 2)
    assert on_line == 0.020 != (3.02 - 3.0) / (2 - 1)
    assert tpot_s({"ttft_s": 3.0, "e2e_s": 3.02, "completion_tokens": 2}) == on_line
    assert tpot_s({"ttft_s": 3.0, "e2e_s": 3.0, "completion_tokens": 1}) is None
    streamed = [StreamedRequest(0, 10, 2, ok=True, completion_tokens=2, ttft_s=3.0, e2e_s=3.02),
                StreamedRequest(1, 10, 1, ok=True, completion_tokens=1, ttft_s=3.0, e2e_s=3.0)]
    assert summarize(streamed, 3.02, 2, 1).tpot.median_ms == on_line * 1e3
    assert RequestTiming(1.0, 4.0, 4.02, 2).itl_s == on_line
    assert RequestTiming(1.0, 4.0, 4.0, 1).itl_s is None
