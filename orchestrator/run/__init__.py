"""Running: Deployment (place -> start -> ready -> teardown) driving bench, sweep, mlperf and the accuracy gate."""
