"""Start-up time of one engine server (StartupTerms): init, weights, KV allocation, CUDA graphs, JIT."""

from __future__ import annotations

from orchestrator.perfmodel.gpus import GB
from orchestrator.perfmodel.server.memory import MemoryTerms
from orchestrator.perfmodel.weights import checkpoint_bytes


# A server without decode graphs (a PD prefill) on cold compile caches compiles again after it is ready: at its first
# prompt forward, whatever its length, and once more at its next one-sequence forward of another length (bench's
# warm-up: one full chunk, then its 64-token remainder). Calibration read from the prefill logs' PDO_ITER run_ms of the
# two fresh-machine H100 V2-Lite PD runs that met both in bench's warm-up, their mean (lease 9,
# benchmarks/results/2026-11-27-warmup-fix-h100/pd-warmupfix.tar.xz: 11,193 ms at 5 sequences / 2,865 tokens, then
# 3,010 ms at 1 x 4,576; lease 13, benchmarks/results/2026-11-27-lease13-h100/call5-pd/pd-warmupfix.tar.xz: 10,177 ms
# at 1 x 8,192, then 2,315 ms at 1 x 64); tests/perfmodel/test_first_prompt_compile.py reads both logs back.
COLD_FIRST_PROMPT_COMPILE_S = 10.685
COLD_SECOND_SHAPE_COMPILE_S = 2.662
# Weight formats whose Triton kernels take one config at every token count, so the warm-up forward before ready builds
# what later prompts run: SGLang 0.5.17's block-FP8 defaults (moe_runner/triton_utils/fused_moe_triton_config.py
# get_default_config, block_shape branch; kernels/ops/quantization/fp8_kernel.py w8a8_block_fp8_matmul) do not depend
# on M, where the unquantized fused-MoE default switches at M > E (V2-Lite's 4-token warm-up builds only the small
# one). The five cold Qwen3-shaped FP8 prefills ran their first prompt forwards in 0.03-1.26 s
# (benchmarks/startup_capture_by_shape.py, COLD_PREFILLS); W4A8 and AWQ have no such log and keep the compile.
NO_FIRST_PROMPT_COMPILE = frozenset({"fp8"})


class StartupTerms(MemoryTerms):
    """Seconds until the server could answer (before warm-up), by phase."""

    def startup_breakdown_s(
        self, load_format: str | None = "dummy", disk_gb_s: float = 2.0, jit_cached: bool = True,
        graph_sizes: int | None = None,
    ) -> dict[str, float]:
        """Start-up phases in seconds: init, weights, KV allocation, CUDA graphs, JIT (cold or warm caches);
        graph_sizes: how many decode graphs a server given its own list (--cuda-graph-bs) captured, else SGLang's.

        Graph capture = batch sizes x layers x the warm per-(size, layer) cost (layers: where the layer shape's capture
        law was measured, StartupCoeffs.capture_layers); with cold caches the first size
        compiles the kernels once (where a profile's cold log showed it; else a compile per size), a server without
        decode graphs compiles them at its first forward, and the first forwards JIT-compile.
        Figures come from the matching calibration profile where it measured them, else the GPU defaults."""
        if load_format == "dummy":
            weights_s = self.weights_bytes_per_gpu() / (self.gpu.dummy_init_gb_s * GB)
        else:  # every TP rank reads the tensors it needs; a node reads its share of the whole checkpoint
            node_bytes = checkpoint_bytes(self.arch, self.quantization) / (self.nnodes if self.pp > 1 else 1)
            weights_s = node_bytes / (disk_gb_s * GB)
        st = self.calibration.startup if self.calibration is not None else None
        sizes = len(self.graph_batch_sizes()) if graph_sizes is None else graph_sizes
        per_bs_layer = (st.graph_bs_layer_s if st and st.graph_bs_layer_s is not None else self.gpu.graph_capture_per_bs_layer_s)
        layers = st.capture_layers(self.arch.num_hidden_layers) if st and st.graph_bs_layer_s is not None else self.arch.num_hidden_layers
        graphs = sizes * layers * per_bs_layer
        if not jit_cached and sizes:
            per_size = st.graph_bs_cold_s if st and st.graph_bs_cold_s is not None else self.gpu.graph_compile_cold_per_bs_s
            if st and st.graph_once_cold_s is not None:  # the first size compiles what the others reuse
                graphs += st.graph_once_cold_s + (sizes - 1) * per_size
            else:
                graphs += sizes * per_size
        init = st.process_s if st and st.process_s is not None else self.gpu.engine_init_s
        if jit_cached:  # a measured warm start's process time already holds whatever compiles on a warm start
            jit = 0.0 if st and st.process_s is not None else self.gpu.jit_warm_s
        else:
            jit = st.jit_cold_s if st and st.jit_cold_s is not None else self.gpu.jit_cold_s
            if not sizes and st and st.graph_once_cold_s is not None:
                # no decode graph to compile the kernels in: the first forward does (the Qwen3-shaped prefill servers'
                # warm-up forward took 61-91 s cold on H100 and 66 s on H200, as long as the decode's first graph)
                jit += st.graph_once_cold_s
        return {
            "init": init,
            "weights": weights_s,
            "kv_alloc": st.kv_alloc_s if st and st.kv_alloc_s is not None else self.gpu.kv_alloc_s,
            "cuda_graphs": graphs,
            "jit": jit,
        }

    def capture_layers_note(self) -> str | None:
        """One line where the decode-graph capture is priced at another layer count than its figure was measured at:
        by the layer shape's measured law, or (no law for the shape) proportional to the layers, extrapolated."""
        cal = self.calibration
        st = cal.startup if cal is not None else None
        layers = self.arch.num_hidden_layers
        if (cal is None or st is None or st.graph_bs_layer_s is None or st.graph_layers in (None, layers)
                or not self.graph_batch_sizes()):
            return None
        measured = f"decode-graph capture at {layers} layers from a figure measured at {st.graph_layers}"
        if st.graph_fixed_share is not None and st.graph_law_layers is not None:
            f, (low, high) = st.graph_fixed_share, st.graph_law_layers
            past = "" if low <= layers <= high else f"; {layers} is past its {low}-{high} layers: extrapolated along its line"
            return (f"{measured}: per size x ({f:.2f} + {1 - f:.2f} x L / {st.graph_layers}), the warm capture law of this "
                    f"layer shape ({st.graph_law}{past})")
        return (f"{measured}: per size x layer, extrapolated (no capture law measured for this layer shape and weight "
                "format; lease 22's is R1-shaped FP8)")

    def first_prompt_compile_s(self, jit_cached: bool = True) -> float:
        """Seconds a server's first two prompt forwards after ready spend compiling: on cold caches, a server without
        decode graphs (whose capture would have built the kernels) in a weight format whose kernels change config with
        the token count; 0 on warm caches, with decode graphs, or in block FP8."""
        if jit_cached or self.graph_batch_sizes() or self.quantization in NO_FIRST_PROMPT_COMPILE:
            return 0.0
        return COLD_FIRST_PROMPT_COMPILE_S + COLD_SECOND_SHAPE_COMPILE_S

    def startup_s(self, load_format: str | None = "dummy", disk_gb_s: float = 2.0, jit_cached: bool = True) -> float:
        """Load + CUDA graphs + JIT + init: seconds until the server could answer (before warm-up)."""
        return sum(self.startup_breakdown_s(load_format, disk_gb_s, jit_cached).values())
