"""KV transfer checks: NIXL endpoint, KV layout and the `preflight` prefill -> decode transfer test."""
