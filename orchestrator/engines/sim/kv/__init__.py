"""The simulated engine's PD KV transfer: `transfer.py` (what both sides share), `prefill.py` (bootstrap server,
senders), `decode.py` (receiver and verification)."""
