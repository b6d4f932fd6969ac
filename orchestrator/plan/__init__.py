"""Planning before launch: memory fit, deadline budget, whole-run simulation, layout search and A/B compare."""
