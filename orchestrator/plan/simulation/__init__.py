"""The planner's virtual-time simulation of a whole run: the layout's servers on a virtual clock, timed by the cost model.

runs.py (SimulatedRun, SimulationError, the batches it runs on) <- servers.py (the layout's SimServers, requests and
the router's Pairing) <- simulate.py (the event loop: simulate_run, Simulation, client_concurrency).
"""
