"""The driver's connection to Ray (orchestrator/cluster/connect.py) without a cluster: what its logs let through."""

from __future__ import annotations

import logging

from orchestrator.cluster.connect import _ServeNoiseFilter


def test_the_drivers_serve_log_drops_start_up_chatter_and_object_reprs_only() -> None:
    """Serve's INFO lines a bench user cannot act on stay out of the output (issue 22's noise); others pass."""
    def shown(message: str) -> bool:
        return _ServeNoiseFilter().filter(logging.LogRecord("ray.serve", logging.INFO, "x", 1, message, None, None))

    assert not shown('Started Serve in namespace "serve".')
    assert not shown('Connecting to existing Serve app in namespace "serve". New http_options/controller_options '
                     "will not be applied.")
    assert not shown("Started <ray.serve._private.router.SharedRouterLongPollClient object at 0x7f3a>.")
    assert shown("Application 'router' is unhealthy: replica failed to start")

