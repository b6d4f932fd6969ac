"""EngineCostModel: one engine server's fields and every term (server/*.py), with SGLang's defaults resolved the way
SGLang derives them; perfmodel/costmodel.py builds it."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.perfmodel import sglang_defaults as sgd
from orchestrator.perfmodel.server.activations import ActivationTerms
from orchestrator.perfmodel.server.decode import DecodeTerms
from orchestrator.perfmodel.server.kv_transfer import KvTransferTerms
from orchestrator.perfmodel.server.prefill import PrefillTerms
from orchestrator.perfmodel.server.startup import StartupTerms
from orchestrator.perfmodel.weights import param_counts, weight_format


@dataclass
class EngineCostModel(DecodeTerms, PrefillTerms, KvTransferTerms, StartupTerms, ActivationTerms):
    """Timing and memory of one engine server (tp x dp x pp GPUs) for one model and weight format: its fields
    (ServerShape), memory terms (MemoryTerms, ActivationTerms) and time terms (DecodeTerms, PrefillTerms, KvTransferTerms,
    StartupTerms), with SGLang's defaults resolved."""

    def __post_init__(self) -> None:
        self.format = weight_format(self.quantization)
        self.params = param_counts(self.arch)
        if self.dp_attention and self.tp % self.dp:
            raise ValueError(f"dp_attention needs tp divisible by dp (tp={self.tp}, dp={self.dp})")
        self.defaults_used = []
        self.resolve_defaults()

    def lent_routing_note(self) -> str | None:
        """Calibration.routing_note where this server's expert reads follow the curve (not a TP group across nodes)."""
        cal = self.calibration
        if cal is None or not self._per_gpu_terms:  # uniform routing there (server/forward.py)
            return None
        return cal.routing_note(self.load_format)

    def resolve_defaults(self) -> None:
        """Fill unset SGLang flags the way SGLang derives them (perfmodel/sglang_defaults.py)."""
        mem_mib = self.gpu.memory_gb * 1024
        if self.chunked_prefill_tokens is None:
            self.chunked_prefill_tokens = sgd.chunked_prefill_default(self.sglang_version, mem_mib)
            self.defaults_used.append(f"chunked_prefill_size={self.chunked_prefill_tokens}")
        if self.mem_fraction_static is None:
            self.mem_fraction_static = sgd.mem_fraction_static_default(
                self.sglang_version,
                sgd.MemFractionInputs(
                    gpu_mem_mib=mem_mib, tp=self.tp, pp=self.pp, dp=self.dp, dp_attention=self.dp_attention,
                    role=self.role, chunked_prefill_size=self.chunked_prefill_tokens,
                    graph_max_bs=self.graph_max_bs or 1, decode_graphs=self.cuda_graph and self.role != "prefill",
                    prefill_graphs=self.prefill_graphs, max_running_requests=self.max_running_requests,
                    mla=self.arch.is_mla, max_total_tokens=self.max_total_tokens,
                ),
            )
            self.defaults_used.append(f"mem_fraction_static={self.mem_fraction_static}")
