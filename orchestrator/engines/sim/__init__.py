"""Simulated SGLang engine: HTTP server, scheduler over the perfmodel cost model, KV transfer, faults, SGLang-named metrics."""
