"""PD pairing core: send one request to a prefill and a decode server at once, the SGLang PD way.

For each request: pick a prefill and a decode (or one aggregated worker) with the routing policy,
give both legs the same body with the same explicit `rid` and a fresh `bootstrap_room`, plus the
chosen prefill's `bootstrap_host`/`bootstrap_port`; return the decode's answer (or relay its SSE
stream). The dispatcher owns what SGLang 0.5.17 does not: a timeout on every leg sized to the time
left, `POST /abort_request` on both legs when one fails, bounded retries on another pair, and
"suspect" marks that keep a failing worker out for a while. No Ray here: the Serve deployment
(`deployments/router.py`, through `orchestrator.router.core.RouterCore`) wraps this class; tests drive it directly on loopback.

settings.py (DispatchSettings) -> workers.py (WorkerPool: the worker set, the pair an attempt gets, legs in flight;
policies.py chooses) -> connections.py (HTTP sessions, health probes, aborts) -> attempt.py (both legs of one attempt;
engine_client.py posts them, pairs.py holds their records, failures.py says how they failed) -> dispatcher.py
(PDDispatcher: one request with retries, or a stream relay.py relays)
"""
