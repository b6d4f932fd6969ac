"""KV hand-off by SGLang's NIXL mechanism: descriptors per request, the worker's time, its constants traced to the
committed PDO_NIXL lines, and the simulation's one worker per queue and the prefill's poll."""

from __future__ import annotations

import heapq
import importlib.util
import math
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.config import config_from_dict, load_config
from orchestrator.config.model_presets import DEEPSEEK_V2_LITE, ModelArchitecture
from orchestrator.perfmodel.costmodel import build_cost_model
from orchestrator.perfmodel.gpus import gpu_spec
from orchestrator.perfmodel.server import kv_transfer
from orchestrator.plan.simulation.servers import SimRequest, layout_servers
from orchestrator.plan.simulation.simulate import Simulation

ROOT = Path(__file__).resolve().parents[2]
QWEN3_L6 = ModelArchitecture.from_hf_config(ROOT / "models/qwen3-235b-a22b-fp8-l6/config.json")


def _kv_mechanism():
    spec = importlib.util.spec_from_file_location("kv_mechanism", ROOT / "benchmarks/kv_mechanism.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_descriptors_are_pages_times_layers_times_kv_buffers() -> None:
    mla = build_cost_model(DEEPSEEK_V2_LITE, "H200", "bf16", role="prefill", page_size=1)
    # the V2-Lite PDO_NIXL lines: a chunk of 128 slots at page 1 is 3,456 descriptors (27 layers, one latent buffer)
    assert mla.kv_descriptors(128) == 3456
    gqa = build_cost_model(QWEN3_L6, "H200", "fp8", role="prefill", page_size=64, load_format="dummy")
    assert gqa.kv_descriptors(4000) == math.ceil(4000 / 64) * 6 * 2  # K and V per layer
    two_stages = build_cost_model(replace(QWEN3_L6, num_hidden_layers=12), "H200", "fp8", role="prefill", pp=2,
                                  page_size=64, load_format="dummy")
    assert two_stages.kv_descriptors(4000) == gqa.kv_descriptors(4000)  # each stage sends its own layers


def test_the_workers_time_follows_chunks_and_bytes_not_descriptors() -> None:
    page1, page64 = (build_cost_model(QWEN3_L6, "H200", "fp8", role="prefill", page_size=p, load_format="dummy",
                                      chunked_prefill_tokens=8192) for p in (1, 64))
    assert page1.kv_descriptors(4000) == 64 * page64.kv_descriptors(4000) - 6 * 2 * (64 * 63 - 4000)
    assert page1.kv_transfer_s(4000, same_node=True) == page64.kv_transfer_s(4000, same_node=True)
    nbytes = 4000 * page1.kv_bytes_per_gpu_token()
    chunks = 1 + 3999 / 8192
    expected = chunks * page1.gpu.kv_chunk_s + nbytes / (450e9 * kv_transfer.KV_NVLINK_SHARE)
    assert page1.kv_transfer_s(4000, same_node=True) == pytest.approx(expected)
    # a prompt twice the chunk size spans three chunks' fixed costs
    assert page1.kv_chunks(8192 * 2 + 1) == pytest.approx(3.0)


def test_the_constants_are_the_fit_of_the_committed_nixl_lines() -> None:
    mech = _kv_mechanism()
    prefill_log, _ = mech._logs(mech.CALLS["call2 (2 x H200, NVLink)"])
    fit = mech.fit_chunks(prefill_log)
    assert fit["chunks"] == 807 and fit["modes"] == ["coalesced", "prepped"]
    assert gpu_spec("H200").kv_chunk_s == pytest.approx(fit["chunk_ms"] / 1e3, abs=5e-6)
    assert gpu_spec("H100-SXM").kv_chunk_s == gpu_spec("H200").kv_chunk_s  # a host's figure, taken for both
    assert kv_transfer.KV_NVLINK_SHARE == pytest.approx(fit["gb_s"] / 450, abs=5e-4)
    assert fit["per_descriptor_ns"] <= 0 and kv_transfer.KV_DESCRIPTOR_S == 0.0  # not resolved: 0, not a guess
    # ~1,000x fewer descriptors on the coalesced path, no less time
    assert fit["descriptors_median"]["prepped"] > 900 * fit["descriptors_median"]["coalesced"]
    assert fit["post_wait_ms_median"]["coalesced"] >= fit["post_wait_ms_median"]["prepped"]
    # a batch's requests reach the queue one by one: the median gap of one result-processing pass
    assert fit["enqueue_gaps"] > 500
    assert kv_transfer.KV_ENQUEUE_INTERVAL_S == pytest.approx(fit["enqueue_interval_ms_median"] / 1e3, abs=5e-6)


def _pd_pair_sim(decodes: int = 1) -> tuple[Simulation, object, list]:
    cfg = load_config(ROOT / "configs/device-h200x2-1p1d.yaml",
                      ["cluster.gpus_per_node=2", f"layout.decode.0.count={decodes}"], paths_from=ROOT)
    prefill, decode, _ = layout_servers(cfg, None)
    return Simulation(prefill, decode, []), prefill[0], decode


def test_one_decode_servers_transfers_share_one_worker_and_queue_behind_each_other() -> None:
    sim, prefill, decode = _pd_pair_sim(decodes=2)
    landed: list[tuple[float, int]] = []
    sim.kv_landed = lambda p, d, req: landed.append((sim.now, req.index))  # type: ignore[method-assign]
    worker_s = prefill.model.kv_transfer_s(1000, same_node=True)  # one lent host: NVLink
    reqs = [SimRequest(i, 1000, 4, prefill=prefill, decode=decode[d]) for i, d in enumerate((0, 0, 1))]
    for req in reqs:
        sim.send_kv(prefill, req)
    while sim.events:  # the simulation's own loop, without a client
        sim.now, _, action, args = heapq.heappop(sim.events)
        action(*args)
    times = dict((i, t) for t, i in landed)
    assert times[0] == pytest.approx(worker_s)
    assert times[1] == pytest.approx(2 * worker_s)  # behind request 0 on the same queue
    assert times[2] == pytest.approx(worker_s)  # the other decode server's queue: its own worker


def test_a_batchs_kv_is_enqueued_request_by_request_and_waits_only_for_what_the_worker_has_left() -> None:
    sim, prefill, decode = _pd_pair_sim()
    interval = kv_transfer.KV_ENQUEUE_INTERVAL_S
    worker_s = prefill.model.kv_transfer_s(1000, same_node=True)  # one lent host: NVLink
    assert worker_s > interval  # 1.28 ms a chunk: the one worker is the slower side
    reqs = [SimRequest(i, 1000, 4, prefill=prefill, decode=decode[0]) for i in range(4)]
    sim.now = 2.0
    sim.send_batch_kv(prefill, reqs)
    for k, req in enumerate(reqs):
        assert req.kv_enqueued_s == pytest.approx(2.0 + k * interval)  # as the result processing reaches it
        assert req.kv_started_s == pytest.approx(2.0 + k * worker_s)  # when the request before it is done
        assert req.kv_started_s - req.kv_enqueued_s == pytest.approx(k * (worker_s - interval))
        assert req.kv_done_s == pytest.approx(2.0 + (k + 1) * worker_s)
    late = SimRequest(9, 1000, 4, prefill=prefill, decode=decode[0])
    sim.send_kv(prefill, late, enqueued_s=reqs[-1].kv_done_s + 1.0)  # an idle worker takes it at once
    assert late.kv_started_s == late.kv_enqueued_s


def test_a_busy_prefill_frees_a_sent_requests_kv_when_its_running_forward_ends() -> None:
    cfg = config_from_dict({
        "cluster": {"gpu": "H200"},
        "model": {"quantization": "w4a8"},
        "engine": {"kind": "sglang", "sglang": {"mem_fraction_static": 0.88}},
        "layout": {"mode": "pd", "prefill": [{"tp": 8}], "decode": [{"tp": 8}]},
    })
    prefill, decode, _ = layout_servers(cfg, None)
    assert prefill[0].polls_transfers and not decode[0].polls_transfers
    simulated_engine = config_from_dict({**cfg.model_dump(mode="json"), "engine": {"kind": "sim"}})
    assert not layout_servers(simulated_engine, None)[0][0].polls_transfers  # our simulated engine frees at once
    sim = Simulation(prefill, decode, [])
    landed: dict[int, float] = {}
    freed: dict[int, float] = {}
    prefill_forward_ends: list[float] = []
    kv_landed, forward_done, release = sim.kv_landed, sim.forward_done, prefill[0].steps.release

    def on_landed(p, d, req):
        landed[req.index] = sim.now
        kv_landed(p, d, req)

    def on_forward_done(server, step, token=None):
        if server is prefill[0]:
            prefill_forward_ends.append(sim.now)
        forward_done(server, step, token)

    def on_release(seq):
        freed[seq.owner.index] = sim.now
        release(seq)

    sim.kv_landed, sim.forward_done, prefill[0].steps.release = on_landed, on_forward_done, on_release  # spies
    sim.run([(6000, 8)] * 24, None)
    assert set(freed) == set(landed) == set(range(24))
    later = [i for i in landed if freed[i] > landed[i]]
    assert later, "with 24 long prompts the prefill is busy when some transfers finish"
    for i in later:  # freed at the end of the forward that was running when its KV landed
        assert freed[i] == min(t for t in prefill_forward_ends if t >= landed[i])


def _link_seconds(config: str, overrides: list[str]) -> tuple[float, object]:
    """A 4,000-token request's worker time on cfg's first prefill -> decode pair, and that prefill's cost model."""
    cfg = load_config(ROOT / config, overrides, paths_from=ROOT)
    prefill, decode, _ = layout_servers(cfg, None)
    sim = Simulation(prefill, decode, [])
    req = SimRequest(0, 4000, 4, prefill=prefill[0], decode=decode[0])
    sim.send_kv(prefill[0], req)
    assert req.kv_done_s is not None and req.kv_started_s is not None
    return req.kv_done_s - req.kv_started_s, prefill[0].model


@pytest.mark.parametrize(("config", "overrides", "nvlink"), [
    ("configs/device-h200x2-1p1d.yaml", [], True),  # the lent two-GPU host: two raylets of one machine
    ("configs/device-h200x2-local-1p1d.yaml", [], True),
    ("configs/device-h200x2-1p1d.yaml", ["cluster.single_host=false"], False),  # two machines of one GPU each
    ("configs/device-h200x2-1p1d.yaml", ["cluster.num_nodes=1", "cluster.gpus_per_node=2", "cluster.single_host=false",
                                         "layout.decode.0.node_role=prefill"], True),  # one node: NVLink
    ("configs/h200-1p1d-tp8.yaml", [], False),  # prefill node and decode node: IB
])
def test_the_kv_link_follows_the_placement(config, overrides, nvlink) -> None:
    seconds, model = _link_seconds(config, overrides)
    assert seconds == pytest.approx(model.kv_transfer_s(4000, same_node=nvlink))
    assert seconds != pytest.approx(model.kv_transfer_s(4000, same_node=not nvlink))
