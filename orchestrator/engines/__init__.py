"""Engines behind one interface: base.py (EngineBackend, registry by engine.kind) -> sglang/ | sim/."""
