"""SGLang 0.5.17's OpenAI routes on the simulated engine: `routes.py` (handlers), `frames.py` (answer shapes)."""
