"""How a server spread over several GPUs spends its time: collectives on NVLink and InfiniBand from published
NCCL figures (collectives.py), pipeline-parallel micro-batch overlap (pipeline.py). Each mechanism composes
the per-GPU step costs of perfmodel/server/ at the shapes a layout gives one GPU; none is fitted to a row.
two_gpu_vs_model.py holds them against a two-GPU calibration run (the servers it ran, as the model builds them)."""
