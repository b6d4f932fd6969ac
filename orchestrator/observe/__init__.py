"""Observing a run: metrics and exporters, Prometheus file_sd and monitor, dashboards, live view, reports."""
