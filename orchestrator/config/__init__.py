"""Run configuration: YAML file + `--set` overrides -> validated `RunConfig` (schema.py, load.py, model_presets.py).

The names every stage uses are re-exported here, so `from orchestrator.config import RunConfig, load_config`.
"""

from orchestrator.config.load import ConfigError, config_from_dict, dump_config, load_config
from orchestrator.config.schema import (
    BenchmarkConfig,
    ClusterConfig,
    EngineConfig,
    LayoutConfig,
    MetricsConfig,
    ModelConfig,
    RouterConfig,
    RunConfig,
    TransferConfig,
    WorkerGroup,
)

__all__ = [
    "BenchmarkConfig", "ClusterConfig", "ConfigError", "EngineConfig", "LayoutConfig", "MetricsConfig",
    "ModelConfig", "RouterConfig", "RunConfig", "TransferConfig", "WorkerGroup",
    "config_from_dict", "dump_config", "load_config",
]
