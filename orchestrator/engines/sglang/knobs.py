"""The typed tuning knobs of one worker group as SGLang 0.5.17 `launch_server` flags (names from its server_args.py).

WorkerGroup (+ engine.sglang defaults) -> ["--attention-backend", ..., "--speculative-algorithm", ...]. build_argv
appends these after the parallel/PD flags. --pp-size is emitted by build_argv itself with the other parallel sizes.
"""

from __future__ import annotations

from orchestrator.config import RunConfig, WorkerGroup


def knob_flags(cfg: RunConfig, group: WorkerGroup) -> list[str]:
    """MoE all-to-all, attention backend, memory fraction, chunked prefill, batch caps, speculative decoding."""
    flags: list[str] = []
    if group.moe_a2a_backend is not None:
        flags += ["--moe-a2a-backend", group.moe_a2a_backend]
    attention = cfg.attention_backend(group)
    if attention:
        flags += ["--attention-backend", attention]
    mem_fraction = cfg.mem_fraction_static(group)
    if mem_fraction is not None:
        flags += ["--mem-fraction-static", str(mem_fraction)]
    if group.chunked_prefill_size is not None:
        flags += ["--chunked-prefill-size", str(group.chunked_prefill_size)]
    if group.max_running_requests is not None:
        flags += ["--max-running-requests", str(group.max_running_requests)]
    if group.cuda_graph_max_bs is not None:  # 0.5.17 name; --cuda-graph-max-bs is a deprecated alias there
        flags += ["--cuda-graph-max-bs-decode", str(group.cuda_graph_max_bs)]
    spec = group.speculative
    if spec is not None:  # DeepSeek's MTP layer is the draft: no --speculative-draft-model-path
        flags += [
            "--speculative-algorithm", spec.algorithm,
            "--speculative-num-steps", str(spec.num_steps),
            "--speculative-eagle-topk", str(spec.eagle_topk),
            "--speculative-num-draft-tokens", str(spec.num_draft_tokens),
        ]
    return flags
