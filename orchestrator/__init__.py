"""pd-orchestrator: place SGLang prefill/decode workers on Ray, route, benchmark and observe them."""

__version__ = "0.1.0"
