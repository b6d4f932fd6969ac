"""Memory of one engine server as SGLang sizes it (MemoryTerms): the static pool and the reserve, the KV pool and its
tokens, running limits, CUDA-graph batch sizes."""

from __future__ import annotations

import math

from orchestrator.perfmodel import sglang_defaults as sgd
from orchestrator.perfmodel.server.stages import StageWeights


class MemoryTerms(StageWeights):
    """Bytes, tokens and limits of the server (resolved by EngineCostModel)."""

    def prefill_chunk_tokens(self) -> int:
        """--chunked-prefill-size as the server runs it (EngineCostModel resolves SGLang's default)."""
        assert self.chunked_prefill_tokens is not None, "EngineCostModel resolves SGLang's default"
        return self.chunked_prefill_tokens

    def held_before_load_bytes(self) -> float:
        """What the driver, the CUDA context, torch and (a server of several GPUs) NCCL hold on one GPU before SGLang
        loads the weights (gpus.py, measured in the raw logs): outside the static pool and outside the reserve."""
        return (self.gpu.held_before_load_gb + (self.gpu.multi_gpu_held_gb if self.tp * self.pp > 1 else 0.0)) * 2**30

    def free_at_load_bytes(self) -> float:
        """The memory one GPU has free when SGLang starts loading the weights: its capacity less what is held before."""
        return self.gpu.memory_bytes - self.held_before_load_bytes()

    def static_pool_bytes(self) -> float:
        """SGLang's static pool per GPU: weights + KV cache = mem_fraction_static x the memory free at weight load.
        0.5.17 mem_cache/kv_cache_configurator.py _profile_available_bytes: KV budget = memory free after the weights -
        pre_model_load_memory x (1 - mem_fraction_static); every uncapped start in benchmarks/results logs its KV size
        within 0.03 GiB of fraction x "Load weight begin. avail mem" - weights (tests/perfmodel/test_sglang_defaults.py)."""
        fraction = self.mem_fraction_static
        assert fraction is not None, "EngineCostModel resolves SGLang's default"
        return fraction * self.free_at_load_bytes()

    def reserve_bytes(self) -> float:
        """Left for activations, CUDA graphs, NCCL buffers: GPU memory less weights and the KV pool (GPU memory -
        mem_fraction_static x the memory free at load, more when --max-total-tokens caps the pool below what the
        fraction allows)."""
        budget, weights = max(0.0, self.kv_bytes_per_gpu()), self.stage_weights_bytes()
        # the stage with the least left: its weights short of the heaviest's, plus its pool (pipeline stages)
        taken = max(self.stage_pool_bytes(k) + (weights[k] - max(weights)) for k in range(self.pp))
        return self.gpu.memory_bytes - self.static_pool_bytes() + (budget - taken)

    def kv_bytes_per_gpu(self) -> float:
        """Static pool left for the KV cache after weights (negative: the weights do not fit): SGLang's KV budget,
        the same on every GPU of the server. 0.5.17 reads the memory free before the weights and after them with
        get_available_gpu_memory(distributed=True), the minimum over every rank of the world group
        (distributed/bootstrap.py, mem_cache/kv_cache_configurator.py _profile_available_bytes), so with pipeline
        stages the heaviest stage's weights set every stage's budget."""
        return self.static_pool_bytes() - self.weights_bytes_per_gpu()

    def stage_pool_bytes(self, stage: int, budget: float | None = None) -> float:
        """Pipeline stage `stage`'s KV pool on one GPU: SGLang turns the budget into tokens of each stage's own layers
        and keeps the minimum over the stages (kv_cache_configurator.py _apply_token_constraints: all_reduce MIN over
        the PP ranks), so the stage with the most layers sets the tokens and each stage allocates them for its own
        layers; capped by --max-total-tokens."""
        free = max(0.0, self.kv_bytes_per_gpu() if budget is None else budget)
        layers = [dense + moe for dense, moe in self.stage_layers()]
        pool = free * (layers[stage] / max(layers))
        if self.max_total_tokens is None:
            return pool
        return min(pool, self.max_total_tokens * self.kv_bytes_per_gpu_token() * self.stage_shares(stage)[0])

    def kv_pool_bytes_per_gpu(self, budget: float | None = None) -> float:
        """The KV pool SGLang allocates on one GPU: its profiled budget (default: what the fraction leaves after the
        weights on a GPU of its own), capped by --max-total-tokens; with pipeline stages the heaviest stage's."""
        return self.stage_pool_bytes(self.heaviest_stage() if self.pp > 1 else 0, budget)

    def kv_bytes_per_token(self) -> int:
        """KV bytes of one token over all layers and ranks: layers x (MLA: kv_lora_rank + rope; GQA: 2 x KV heads x
        head_dim) x dtype (+ the MTP layer)."""
        layers = self.arch.num_hidden_layers
        extra = 1 if self.speculative is not None else 0
        return self.arch.kv_bytes_per_token(self.kv_dtype_bytes) * (layers + extra) // layers

    def kv_bytes_per_gpu_token(self) -> float:
        """One token's KV bytes on one GPU: all of it under MLA (replicated over TP), a share of the KV heads
        under GQA (split over the attention-TP ranks)."""
        return self.kv_bytes_per_token() * self.arch.kv_share_per_rank(self.tp // self.attn_dp)

    def kv_capacity_tokens(self) -> int:
        """Tokens of KV one server holds: MLA replicates KV over TP (GQA splits it); DP attention and replicas add;
        --max-total-tokens caps each scheduler's pool."""
        return self.kv_tokens_in(self.kv_bytes_per_gpu())

    def kv_tokens_in(self, pool_bytes_per_gpu: float) -> int:
        """The server's KV tokens when each GPU has `pool_bytes_per_gpu` for its pool (SGLang's profiled budget),
        capped per scheduler at --max-total-tokens."""
        if pool_bytes_per_gpu <= 0:
            return 0
        most_layers = max(dense + moe for dense, moe in self.stage_layers())  # sets the tokens (stage_pool_bytes)
        per_gpu_token = self.kv_bytes_per_gpu_token() * (most_layers / self.arch.num_hidden_layers)
        per_scheduler = int(pool_bytes_per_gpu // per_gpu_token)
        if self.max_total_tokens is not None:
            per_scheduler = min(per_scheduler, self.max_total_tokens)
        return per_scheduler * self.attn_dp * self.replicas

    def max_running(self) -> int:
        """Requests the server runs at once, as SGLang derives it per scheduler (DP-attention rank, replica).

        --max-running-requests (split over DP-attention ranks, capped at half the rank's KV tokens in 0.5.x),
        else clamp(tokens / context x 512, 2048, 4096) capped at tokens / 2: never unlimited.
        """
        return max(1, self.running_per_scheduler() * self.attn_dp * self.replicas)

    def running_per_scheduler(self) -> int:
        """One scheduler's running limit, which is also the size of its request pool (0.5.17
        kv_cache_configurator.resolve_max_num_reqs sizes req_to_token_pool with it)."""
        ranks = self.attn_dp * self.replicas
        per_rank_tokens = self.kv_capacity_tokens() // max(1, ranks)
        context = self.context_length or self.arch.max_position_embeddings
        requested = self.max_running_requests
        if requested is None and self.speculative is not None:
            requested = 48  # SGLang 0.5.17's speculative_hook, unless --max-running-requests is given
        return sgd.max_running_requests(self.sglang_version, per_rank_tokens, context, requested, attn_dp=self.attn_dp)

    @property
    def graph_max_bs(self) -> int:
        """--cuda-graph-max-bs as SGLang's server_args resolves it (the flag, else its GPU/TP default; 0 without
        decode graphs): what its mem_fraction_static default reserves for. The graphs it captures may stop lower
        (captured_graph_max_bs)."""
        if not self.cuda_graph or self.role == "prefill":
            return 0
        return self.cuda_graph_max_bs or sgd.cuda_graph_max_bs_default(
            self.sglang_version, self.gpu.memory_gb * 1024, self.tp
        )

    @property
    def captured_graph_max_bs(self) -> int:
        """The largest decode graph one scheduler captures, which sizes the graph buffers: graph_max_bs capped at
        its request pool (SGLang 0.5.17 runner/base_cuda_graph_runner.py get_batch_sizes_to_capture drops sizes
        above req_to_token_pool.size and adds the pool size itself), so a server capped at 256 running requests
        captures to 256 even where the default max is 512."""
        sizes = self.graph_batch_sizes()
        return max(sizes) if sizes else 0

    def graph_batch_sizes(self) -> list[int]:
        """Decode batch sizes SGLang captures at start (none on a PD prefill server or with graphs off), up to its
        request pool. A server whose weights leave no KV never starts; its list is server_args' own (the start-up
        fits read it at another layer shape's TP)."""
        if self.graph_max_bs == 0:
            return []
        req_pool = self.running_per_scheduler()
        return sgd.cuda_graph_batch_sizes(
            self.sglang_version, self.gpu.memory_gb * 1024, self.tp, self.cuda_graph_max_bs, req_pool or None
        )

    def decode_runs_eager(self, batch_size: int) -> bool:
        """True when a decode step of `batch_size` (whole server) exceeds the largest captured graph: one attention
        rank's share, and with pipeline parallelism one micro-batch's (each forward replays the graph of its own
        micro-batch size, server/decode.py splits the batch into min(pp, batch) of them)."""
        requests = math.ceil(batch_size / max(1, self.replicas))
        micro = max(1, min(self.pp, requests))
        return math.ceil(requests / micro / self.attn_dp) > self.graph_max_bs
