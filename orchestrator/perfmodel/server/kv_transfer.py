"""KV transfer time of one request from a prefill server to a decode server (KvTransferTerms): link time and the
measured per-request delay."""

from __future__ import annotations

from orchestrator.perfmodel.gpus import GB
from orchestrator.perfmodel.server.memory import MemoryTerms


class KvTransferTerms(MemoryTerms):
    """Seconds to move one request's KV latent prefill -> decode."""

    def kv_transfer_s(self, num_tokens: int, same_node: bool) -> float:
        """Moving one request's KV latent prefill -> decode: link time + the per-request delay."""
        return self.kv_transfer_link_s(num_tokens, same_node) + self.kv_transfer_delay_s()

    def kv_transfer_link_s(self, num_tokens: int, same_node: bool) -> float:
        """Link time of one request's KV latent over NVLink (same node) or one GPU's IB rail."""
        link_gb_s = self.gpu.nvlink_gb_s if same_node else self.gpu.ib_gb_s
        nbytes = num_tokens * self.kv_bytes_per_gpu_token()  # each rank sends its share on its own rail
        return nbytes / (link_gb_s * GB * self.comm_efficiency)

    def kv_transfer_delay_s(self) -> float:
        """Per-request time of a KV transfer beyond the link time, overlapping other transfers: SGLang's
        measured mean transfer latency at this page size (per-descriptor cost, handshakes, queueing on the
        transfer threads), scaled by layers; else the GPU's fixed handshake figure."""
        cal = self.calibration
        if cal is not None and cal.shape_matches:
            measured = cal.transfer_latency_s(self.page_size)
            if measured is not None:
                return measured * self.arch.num_hidden_layers / cal.layers
        return self.gpu.transfer_latency_s
