"""Performance model: GPU specs + model architecture -> per-engine cost model (bytes, step times, start-up)."""
