"""Simulated SGLang engine: HTTP server, cost model, metrics with SGLang names."""
