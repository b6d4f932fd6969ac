"""Competition rules as profiles: profiles/<name>.yaml -> RulesProfile -> check_config(RunConfig) -> verdict."""

from orchestrator.rules.check import (
    COMPLIANT, NOT_COMPLIANT, RulesVerdict, Violation, check_config, profile_name, verdict_for,
)
from orchestrator.rules.profile import PROFILES_DIR, RulesError, RulesProfile, available_profiles, load_profile

__all__ = [
    "COMPLIANT", "NOT_COMPLIANT", "PROFILES_DIR", "RulesError", "RulesProfile", "RulesVerdict", "Violation",
    "available_profiles", "check_config", "load_profile", "profile_name", "verdict_for",
]
