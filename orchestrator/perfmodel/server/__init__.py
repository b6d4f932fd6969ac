"""One engine server's cost model, one job per module, each a class built on the ones it reads:

shape (ServerShape: the fields) -> stages (what each GPU of a pipeline stage holds) -> memory (pool, KV, limits, graphs)
  -> activations (headroom) | forward (roofline forward, reads, collectives) -> prefill | decode | kv_transfer | startup
  -> engine_cost_model (EngineCostModel: all of them, SGLang's defaults resolved; perfmodel/costmodel.py builds it)
"""
