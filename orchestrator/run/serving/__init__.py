"""`pd-orchestrator serve`: PD serving that stays up — its life (`lifecycle`), its state (`service`), pair warm-up and
drain (`warmup`), live layout changes (`changes`), its local control socket (`control`), the detached form (`detach`).
"""
