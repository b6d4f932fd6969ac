"""bench's and prepare's warm-up: which servers get the run's first forward, paired with what, and what is reported.
(The end-to-end check, each prefill's first logged forward after start-up, is tests/run/test_bench.py's Ray run.)"""

from __future__ import annotations

from orchestrator.records import RequestResult, WorkerEndpoint
from orchestrator.run.bench_warmup import FirstForwardWarmup, first_forward_targets, warmup_failures


def _endpoint(name: str, role: str) -> WorkerEndpoint:
    return WorkerEndpoint(role=role, name=name, url=f"http://127.0.0.1:1/{name}")  # type: ignore[arg-type]


def test_every_prefill_replica_of_every_group_gets_its_groups_first_forward_paired_with_the_decodes_in_turn(
        make_sim_config):
    cfg = make_sim_config(prefill=[{"count": 2, "tp": 1}, {"count": 1, "tp": 4, "dp": 2, "dp_attention": True,
                                                            "name": "wide"}],
                          decode=[{"count": 2, "tp": 1}],
                          overrides={"benchmark.warmup": {"policy": "dataset"}})
    endpoints = [_endpoint("decode-0/1", "decode"), _endpoint("prefill-0/1", "prefill"), _endpoint("wide/0", "prefill"),
                 _endpoint("prefill-0/0", "prefill"), _endpoint("decode-0/0", "decode"),
                 _endpoint("stray/0", "prefill")]
    targets, unclaimed = first_forward_targets(cfg, endpoints)
    assert [(t.server.name, t.decode.name if t.decode else None, t.forward.group_index, t.forward.ranks)
            for t in targets] == [("prefill-0/0", "decode-0/0", 0, 1), ("prefill-0/1", "decode-0/1", 0, 1),
                                  ("wide/0", "decode-0/1", 1, 2)]
    assert unclaimed == ["stray/0"]  # a server the run can reach but no group names is reported, not skipped


def test_aggregated_servers_are_warmed_alone(make_sim_config):
    cfg = make_sim_config(overrides={"layout": {"mode": "aggregated", "aggregated": [{"count": 2, "tp": 1}]},
                                     "benchmark.warmup": {"policy": "dataset"}})
    targets, unclaimed = first_forward_targets(cfg, [_endpoint("aggregated-0/0", "aggregated"),
                                                     _endpoint("aggregated-0/1", "aggregated")])
    assert [(t.server.name, t.decode) for t in targets] == [("aggregated-0/0", None), ("aggregated-0/1", None)]
    assert not unclaimed


def test_a_failed_first_forward_and_a_failed_short_prompt_are_both_named():
    first = [FirstForwardWarmup("prefill-0/0", 8256, 1, 1.0), FirstForwardWarmup("prefill-0/1", 8256, 1, 0.1, "boom")]
    short = [RequestResult(index=5, status="failed", prompt_len=10, output_len=4, error="decode leg: 503")]
    line = warmup_failures(first, short)
    assert line == ("1/2 first forwards failed, first: prefill-0/1: boom; 1/1 prompts failed, first: decode leg: 503")
    assert warmup_failures(first[:1], []) is None
