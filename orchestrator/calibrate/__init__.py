"""Calibration harness: measure real SGLang on the GPU it runs on (issue 14).

Stdlib only, so it runs on a bare GPU machine with just the carried SGLang tree on PYTHONPATH:
  python3 -m orchestrator.calibrate single --model-path M --name N --out DIR --budget-s S
  python3 -m orchestrator.calibrate pd --model-path M --out DIR --budget-s S
  python3 -m orchestrator.calibrate twogpu --model-path M --out DIR --budget-s S [--dry-run]   (two GPUs)
  python3 -m orchestrator.calibrate nixl-patch SITE_DIR
  python3 -m orchestrator.calibrate parse-log SERVER.LOG
Raw results: DIR/calibration-<name>.json (schema "pdo-calibration-raw/1") plus every server log.
"""
