"""The step loop (perfmodel/scheduling/steps.py): which forward runs next, what it costs, what it hands off."""

from __future__ import annotations

from orchestrator.perfmodel.scheduling.limits import Seq, ServerLimits
from orchestrator.perfmodel.scheduling.steps import StepScheduler


class RecordingCost:
    """Step times that encode their arguments, so a test can read back what the loop asked for."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.follows: list[bool] = []

    def prefill_time_s(self, new_tokens, cached_tokens=None, chunk_follows=False) -> float:
        self.calls.append(("prefill", list(new_tokens), list(cached_tokens or [])))
        self.follows.append(chunk_follows)
        return 1.0 + sum(new_tokens) / 1000

    def decode_step_s(self, batch_size: int, context_tokens: int) -> float:
        self.calls.append(("decode", batch_size, context_tokens))
        return 0.01 * batch_size


def server(role: str, kv: int = 100_000, chunk: int = 8192, max_running: int = 64,
           cached=None) -> tuple[StepScheduler, RecordingCost]:
    cost = RecordingCost()
    return StepScheduler(ServerLimits(role, kv, max_running, chunk), cost, cached_tokens=cached), cost


def test_an_aggregated_server_prefills_a_waiting_prompt_before_the_next_decode_step_never_both():
    steps, cost = server("aggregated", chunk=300)
    first = Seq(100, 5)
    steps.submit(first)
    step = steps.schedule()
    assert step.forward is not None and step.forward.kind == "prefill" and step.forward.prefill == [(first, 100)]
    assert step.forward.duration_s == 1.1 and cost.calls == [("prefill", [100], [0])]
    assert steps.update_from_output(step) == [first] and first.state == "running"
    late = Seq(500, 5)  # arrives while `first` decodes: its two chunks run first, the decode waits
    steps.submit(late)
    kinds = []
    for _ in range(3):
        step = steps.schedule()
        assert step.forward is not None
        kinds.append((step.forward.kind, [take for _, take in step.forward.prefill], len(step.forward.running)))
        steps.update_from_output(step)
    assert kinds == [("prefill", [300], 0), ("prefill", [200], 0), ("decode", [], 2)]
    assert cost.calls[-1] == ("decode", 2, 100 + 1 + 500 + 1)  # both prompts and the token each prefill made


def test_each_prefill_chunk_says_whether_another_waits_behind_it_so_a_pipeline_can_overlap_them():
    steps, cost = server("aggregated", chunk=300)
    for length in (500, 100):  # chunks of 300, then 200 + 100 together
        steps.submit(Seq(length, 5))
    for _ in range(2):
        step = steps.schedule()
        assert step.forward is not None and step.forward.kind == "prefill"
        steps.update_from_output(step)
    assert cost.follows == [True, False]  # the last chunk of the stream drains the pipeline alone


def test_a_pd_prefill_holds_the_kv_for_its_transfer_and_never_decodes():
    steps, _ = server("prefill")
    seq = Seq(200, 1)
    steps.submit(seq)
    step = steps.schedule()
    assert steps.update_from_output(step) == [seq] and seq.state == "held" and seq.output == 1
    assert steps.schedule().forward is None and steps.batch.kv_used == 200
    steps.release(seq)
    assert steps.batch.kv_used == 0 and steps.idle()


def test_a_pd_decode_preallocates_at_its_next_turn_and_hands_the_request_off_for_its_prefill():
    steps, _ = server("decode")
    running = Seq(50, 10)
    steps.enqueue_prealloc(running, kv_local=True)  # no transfer: there as soon as it is pre-allocated
    step = steps.schedule()
    assert step.preallocated == [running] and step.joined == [running] and step.forward is not None
    arriving = Seq(80, 4)
    steps.enqueue_prealloc(arriving)  # arrives while the decode step runs: nothing is allocated mid-forward
    assert arriving.state == "prealloc" and steps.batch.kv_used == 51
    steps.update_from_output(step)
    step = steps.schedule()  # SGLang's process_decode_queue, once per turn of the event loop
    assert step.preallocated == [arriving] and arriving.state == "transfer" and step.joined == []
    assert step.forward is not None and step.forward.running == [running]  # the transfer has not landed
    steps.update_from_output(step)
    steps.submit(arriving)  # its KV landed with the prefill's first token
    step = steps.schedule()
    assert step.joined == [arriving] and steps.batch.generated(arriving) == 1
    assert step.forward is not None and set(step.forward.running) == {running, arriving}


def test_a_prefix_cache_hit_is_charged_as_cached_tokens():
    steps, cost = server("aggregated", cached=lambda seq: 150)
    seq = Seq(200, 3)
    steps.submit(seq)
    step = steps.schedule()
    assert step.forward is not None and step.forward.prefill == [(seq, 50)]
    assert cost.calls == [("prefill", [50], [150])]


def test_a_decode_step_that_does_not_fit_retracts_before_it_runs_and_leaves_the_retracted_out():
    # 16 reserved tokens (--num-reserved-decode-tokens 16) instead of 512, so two requests outgrow the pool
    cost = RecordingCost()
    steps = StepScheduler(ServerLimits("decode", 1300, 64, 8192, reserved_decode_tokens=16), cost)
    a, b = Seq(600, 400), Seq(100, 400)
    for s in (a, b):
        steps.enqueue_prealloc(s, kv_local=True)
    while True:
        step = steps.schedule()
        assert step.forward is not None
        if step.retracted:
            break
        steps.update_from_output(step)
    # 600 + 100 prompts + their outputs outgrow 1300 slots: the longer prompt goes to host memory first
    assert step.retracted == [a] and a.state == "retracted" and step.forward.running == [b]
    assert cost.calls[-1] == ("decode", 1, 100 + steps.batch.generated(b))


def test_a_request_ended_while_its_forward_runs_is_not_reported_and_frees_its_kv():
    steps, _ = server("aggregated")
    kept, aborted = Seq(100, 5), Seq(100, 5)
    for s in (kept, aborted):
        steps.submit(s)
    step = steps.schedule()
    steps.finish(aborted)  # an abort arrives mid-forward
    assert steps.update_from_output(step) == [kept]
    assert steps.batch.kv_used == kept.kv_tokens == 101


def test_nothing_to_run_is_no_forward():
    for role in ("aggregated", "prefill", "decode"):
        steps, cost = server(role)
        step = steps.schedule()
        assert step.forward is None and not (step.preallocated or step.joined or step.retracted)
        assert steps.update_from_output(step) == [] and cost.calls == []


def test_an_idle_server_runs_the_first_request_of_a_burst_alone_then_batches_the_rest():
    # SGLang's idle loop schedules as soon as one request is waiting; the rest of a burst lands during that forward
    steps, cost = server("aggregated")
    burst = [Seq(100, 1) for _ in range(4)]
    for seq in burst:
        steps.submit(seq)
    takes = []
    while (step := steps.schedule()).forward is not None:
        takes.append([seq for seq, _ in step.forward.prefill])
        steps.update_from_output(step)
    assert takes == [burst[:1], burst[1:]]
    assert cost.calls == [("prefill", [100], [0]), ("prefill", [100, 100, 100], [0, 0, 0])]


def test_a_busy_server_takes_every_waiting_request_into_its_next_prefill():
    steps, _ = server("aggregated")
    steps.submit(Seq(100, 50))
    steps.update_from_output(steps.schedule())  # the first request runs: the server is busy from now on
    step = steps.schedule()
    assert step.forward is not None and step.forward.kind == "decode"
    late = [Seq(100, 1) for _ in range(3)]
    for seq in late:
        steps.submit(seq)
    steps.update_from_output(step)
    step = steps.schedule()
    assert step.forward is not None and [seq for seq, _ in step.forward.prefill] == late
