"""SGLang 0.5.17's scheduling decisions as perfmodel/admission.py's BatchSchedule makes them."""

from __future__ import annotations

import pytest

from orchestrator.perfmodel.scheduling.admission import BatchSchedule
from orchestrator.perfmodel.scheduling.limits import Seq, ServerLimits


def decode_server(kv: int, max_running: int = 64) -> BatchSchedule:
    return BatchSchedule(ServerLimits("decode", kv, max_running, 8192))


def test_pd_decode_preallocates_the_prompt_only_and_keeps_512_tokens_of_headroom_per_active_request() -> None:
    sched = decode_server(kv=2000)
    seqs = [Seq(100, 1000) for _ in range(3)]
    for s in seqs:
        sched.enqueue_prealloc(s)
    # first: max(100 + 512, 100 + 1000) <= 2000; second: <= 1900 - 512 x 1; third: 1800 - 512 x 2 < 1100
    assert sched.pop_preallocated() == seqs[:2]
    assert sched.kv_used == 200 and [s.state for s in seqs] == ["transfer", "transfer", "prealloc"]


def test_pd_decode_joins_with_the_prefills_token_and_frees_everything_at_the_end() -> None:
    sched = decode_server(kv=10_000)
    seq = Seq(50, 3)
    sched.enqueue_prealloc(seq)
    assert sched.pop_preallocated() == [seq]
    sched.submit(seq)  # its KV landed
    assert sched.admit_transferred() == [seq] and sched.generated(seq) == 1 and sched.kv_used == 51
    assert sched.decode_done() == [] and sched.decode_done() == [seq]
    assert sched.kv_used == 0 and sched.idle() and seq.output == 3


def test_pd_decode_retracts_to_host_memory_blocks_new_preallocations_and_resumes_without_a_prefill() -> None:
    # 16 reserved tokens (--num-reserved-decode-tokens 16) instead of 512, so two requests outgrow the pool
    sched = BatchSchedule(ServerLimits("decode", 1300, 64, 8192, reserved_decode_tokens=16))
    a, b = Seq(600, 400), Seq(100, 400)
    for s in (a, b):
        sched.enqueue_prealloc(s)
        assert sched.pop_preallocated() == [s]  # b: max(116, 500 - 601) <= 699 - max(16, 1000 - 601)
        sched.submit(s)
        assert sched.admit_transferred() == [s]
    while not sched.before_decode():  # 600 + 400 + 100 + 400 > 1300: a step runs out of KV
        sched.decode_done()
    # equal output counts: SGLang retracts the longer prompt; its KV goes to host memory
    assert a.state == "retracted" and a.retractions == 1 and a.kv_tokens == 0 and b.state == "running"
    late = Seq(10, 10)
    sched.enqueue_prealloc(late)
    assert sched.pop_preallocated() == [] and late.state == "prealloc"  # retracted requests come first
    while b.state == "running":
        sched.decode_done()
    assert sched.pop_preallocated() == [late] and a.state == "waiting"
    assert a.fill == 600 + a.output and a.kv_tokens == a.fill  # its KV is back: no prefill
    assert sched.admit_transferred() == [a] and a.state == "running" and sched.generated(a) == a.output


def test_aggregated_admission_charges_this_batchs_earlier_admissions_their_max_new_tokens() -> None:
    sched = BatchSchedule(ServerLimits("aggregated", 3000, 64, 8192))
    first, second = Seq(100, 1500), Seq(100, 1500)
    sched.submit(first)
    sched.submit(second)
    # second alone: 100 + 1500 + 1 < 3000 - 100; with first's 1500 output charged it does not fit
    assert [s for s, _ in sched.next_prefill()] == [first]
    assert sched.prefill_done() == [first] and first.state == "running"
    # now the running batch is charged new_token_ratio (0.7) x its remaining 1499: 3000 - 101 - 1049 > 1601
    assert [s for s, _ in sched.next_prefill()] == [second]


def test_a_role_outside_the_three_is_refused() -> None:
    with pytest.raises(ValueError, match="role='router'; allowed: aggregated, prefill, decode"):
        ServerLimits("router", 100, 1, 10)


def test_pd_decode_extra_request_slots_follow_sglangs_per_dp_worker_rule() -> None:
    # SGLang 0.5.17 pd_disaggregation_hook: --max-running-requests // --dp-size <= 32 -> 2x that per worker extra
    def slots(max_running: int, dp_size: int, given: bool = True) -> int:
        return ServerLimits("decode", 10**6, max_running, 8192, max_running_set=given, dp_size=dp_size).decode_request_slots

    assert slots(32, 1) == 32 + 1 + 64
    assert slots(64, 1) == 64 + 1  # one worker of 64: no extra slots
    assert slots(256, 8) == 256 + 1 + 512  # eight DP-attention workers of 32 each: 2 x 32 extra each
    assert slots(264, 8) == 264 + 1  # 33 per worker: none
    assert slots(32, 1, given=False) == 32 + 1  # only when --max-running-requests is given


def test_the_planners_decode_limits_carry_sglangs_dp_size() -> None:
    from orchestrator.config.model_presets import DEEPSEEK_R1
    from orchestrator.perfmodel.costmodel import EngineCostModel
    from orchestrator.perfmodel.gpus import gpu_spec
    from orchestrator.perfmodel.scheduling.limits import server_limits

    decode = EngineCostModel(arch=DEEPSEEK_R1, gpu=gpu_spec("H200"), role="decode", tp=8, dp=8, dp_attention=True,
                             quantization="w4a8", max_running_requests=256)
    limits = server_limits(decode)
    assert limits.dp_size == 8 and limits.max_running == 256
    assert limits.decode_request_slots == 256 + 1 + 512
