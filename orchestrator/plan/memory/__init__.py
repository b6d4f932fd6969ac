"""Memory preflight: does each worker group's server fit its GPUs, and does its KV hold the batch?

config -> per group: weights/GPU (by weight class), activation + CUDA-graph reserve, KV tokens left,
KV the batch's concurrency needs -> verdict fits | fits-with-little-KV | does-not-fit -> MemoryReport,
with the nearest layouts that fit when one does not. `bench` calls `require_fit` before any bring-up.

Assumptions are the cost model's (orchestrator/perfmodel/server/memory.py): SGLang's static pool is
mem_fraction_static x the memory free at weight load and holds weights + KV (with PP the heaviest stage's weights
set every stage's budget); the rest is the activation/CUDA-graph reserve.

report.py (verdicts, GroupMemory, MemoryReport) <- server_fit.py (one group's servers on their GPUs) <- shared_gpu.py
(servers sharing one GPU, judged together) <- preflight.py (check_layout_fits, require_fit, the nearest layouts that fit);
defaults_text.py: the SGLang defaults each group takes, as `plan` prints them.
"""
