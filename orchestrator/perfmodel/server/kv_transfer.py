"""KV transfer time of one request from a prefill server to a decode server (KvTransferTerms), by SGLang 0.5.17's
NIXL mechanism: one transfer worker posts a request's KV chunk by chunk, each chunk a list of descriptors (one per
page per layer per KV buffer), and waits until NIXL reports it done.

What a decode waits for beyond this worker time is scheduled by the planner's simulation
(plan/simulation/simulate.py), not priced here: the prefill's overlap loop sends a batch's KV one forward late
(the send delay), request by request as its result processing reaches each (KV_ENQUEUE_INTERVAL_S apart), a
prefill's transfers to one decode server share one worker (SGLang's queue = sum(decode ports) % 4), the decode sees
the KV on its next scheduler iteration, and the prefill frees it on its next poll (once per forward batch: what
SGLang's kv_transfer_latency_ms mostly measures). Where the constants come from:
benchmarks/results/2026-11-27-kv-mechanism/ (kv_worker_fit.py over the PDO_NIXL lines of
benchmarks/results/2026-11-24-kv-transfer-h100-s5, call 2: V2-Lite shape, prefill and decode on two H200s of one
host, 807 chunks, SGLang's prepped path and a coalesced one with ~1,000x fewer descriptors).
"""

from __future__ import annotations

import math

from orchestrator.perfmodel.gpus import GB
from orchestrator.perfmodel.parallel import collectives
from orchestrator.perfmodel.server.memory import MemoryTerms

# Per descriptor: the same fit gives -3.0 ns (SGLang's prepped path alone: +9 ns): no cost the data resolve, so 0.
KV_DESCRIPTOR_S = 0.0
# Bytes of a chunk over NVLink through NIXL/UCX (cuda_ipc): 118 GB/s in that fit, 0.262 of the 450 GB/s per
# direction of NVLink 4 (gpus.py), far below the 0.8 share of the collectives (ServerShape.comm_efficiency).
KV_NVLINK_SHARE = 0.262
# SGLang 0.5.17's transfer queues per prefill scheduler (one worker thread each; SGLANG_DISAGGREGATION_QUEUE_SIZE).
KV_TRANSFER_QUEUES = 4
# A batch's requests reach the queue one by one, as the scheduler's result processing reaches each of them
# (process_batch_result_disagg_prefill -> send_kv_chunk -> add_transfer_request): consecutive enqueues of one pass
# 0.86 ms apart, the median of call 2's gaps under 5 ms (the trough between a pass's gaps and the next pass's; the
# fit's PDO_NIXL lines, benchmarks/kv_mechanism.py fit). A host CPU's figure, taken for every host here.
KV_ENQUEUE_INTERVAL_S = 0.86e-3


class KvTransferTerms(MemoryTerms):
    """Seconds one transfer worker spends moving one request's KV prefill -> decode."""

    def kv_transfer_s(self, num_tokens: int, same_node: bool) -> float:
        """One request's KV on one worker: its chunks' fixed cost, its descriptors, its bytes on the link."""
        return self.kv_transfer_fixed_s(num_tokens) + self.kv_transfer_link_s(num_tokens, same_node)

    def kv_transfer_fixed_s(self, num_tokens: int) -> float:
        """The worker's time beyond the bytes: per chunk (post + wait: gpus.GpuSpec.kv_chunk_s, the same least squares
        over the 807 chunks, whatever their descriptor count) and per descriptor."""
        return self.kv_chunks(num_tokens) * self.gpu.kv_chunk_s + self.kv_descriptors(num_tokens) * KV_DESCRIPTOR_S

    def kv_transfer_link_s(self, num_tokens: int, same_node: bool) -> float:
        """Link time of one request's KV, each rank its share on its own link: NVLink (same node) at the NIXL share
        measured on it; across nodes one NDR NIC's point-to-point rate as published for nccl-tests (collectives.HOPPER
        inter_p2p_bw, 48 GB/s: the KV path over IB was not measured here)."""
        nbytes = num_tokens * self.kv_bytes_per_gpu_token()
        if same_node:
            return nbytes / (self.gpu.nvlink_gb_s * GB * KV_NVLINK_SHARE)
        return nbytes / collectives.link_figures(self.gpu, self.comm_efficiency).inter_p2p_bw

    def kv_chunks(self, num_tokens: int) -> float:
        """Chunks one request's KV is sent in: one per forward batch its prompt spans (expected value for a prompt
        placed at random in the --chunked-prefill-size batches: 1 + (tokens - 1) / chunk)."""
        return 1.0 + (num_tokens - 1) / self.prefill_chunk_tokens()

    def kv_descriptors(self, num_tokens: int) -> int:
        """NIXL descriptors of one request on one rank on SGLang's prepped path: pages x the rank's layers x KV
        buffers per layer (MLA latent: 1; GQA: K and V)."""
        pages = math.ceil(num_tokens / self.page_size)
        layers = math.ceil(self.arch.num_hidden_layers / self.pp) + (1 if self.speculative is not None else 0)
        return pages * layers * (1 if self.arch.is_mla else 2)
