"""Back-test: predict every recorded real run from its conditions and compare with what was measured.

benchmarks/backtest/runs.yaml (rows: conditions, config + overrides, batch, measured figures, bound)
-> per row: the planner's prediction with the shipped calibration profiles (simulate_run for throughput,
engine_start_s for start-ups, the activation-headroom check for memory outcomes) -> BacktestRow
(prediction, measurement, error, within its bound) -> table; plus derived rows: the PD / aggregated
ratio and the direction of every knob that two rows differ in. Every row is in-sample (a shipped profile
was fitted on that run) or out-of-sample, and every throughput row measures a full run (a batch through the
servers: what `plan` predicts) or one calibration point (one lone server's decode/context/prefill point of a
`pdo-calibration-raw/1` file, timed by the harness client's wall); `mape` summarises each set and class
separately and `error_band` is the out-of-sample full-run throughput error `plan` prints next to its
predictions, with the calibration points' figure beside it. Bounds are the dataset's, set before
a row was first predicted; a row outside its bound is reported (`expect: miss`), never held to a wider one.

No GPU and no dataset are needed: batches are the committed request lengths of the real runs.

dataset.py (runs.yaml, batches) -> rows.py (BacktestRow, each row's honesty fields) -> predict.py (one row, the derived
rows, the whole back-test) -> report.py (table, MAPE, summary) | band.py (the error band `plan` prints)
"""
