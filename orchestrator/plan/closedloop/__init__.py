"""Closed-loop workloads in the planner: N clients resending identical requests (client.py), the per-N prediction
and its gate (predict.py), and the layout search ranked by good output tok/s at the best passing N (search.py)."""
