"""Accuracy gate: token-for-token comparison with a reference, stored references, and its failure messages."""

from __future__ import annotations

import hashlib
import json

import pytest

from orchestrator.cli import main
from orchestrator.run import accuracy
from orchestrator.run.accuracy import AccuracyGateError, AccuracyGateSpec
from tests.support import default_sim_config, sim_server

SPEC = AccuracyGateSpec(num_prompts=4, max_new_tokens=8)


def test_fixed_prompt_set_is_the_same_every_time_and_depends_on_seed():
    # pinned: stored references (and every earlier run's gate) were made from exactly these prompts
    prompts = accuracy.fixed_prompt_set(4, 7)
    assert [len(p) for p in prompts] == [191, 137, 129, 217]
    assert prompts[0][:6] == [25896, 17021, 10842, 5799, 20791, 1019]
    assert hashlib.sha256(json.dumps(prompts).encode()).hexdigest()[:16] == "9018e5df6e98bf0b"
    assert accuracy.fixed_prompt_set(4, 7) != accuracy.fixed_prompt_set(4, 8)
    assert all(16 <= len(p) <= 256 for p in accuracy.fixed_prompt_set(20, 1))


def test_comparison_names_first_differing_prompt_and_position():
    result = accuracy.compare_outputs([[1, 2, 3], [4, 5, 6], [7, 8]], [[1, 2, 3], [4, 9, 6], [7, 0]])
    assert not result.passed
    assert result.metrics["mismatched_prompts"] == 2
    assert result.detail.startswith("2/3 prompts differ; prompt 1 differs at output token 1")


def test_shorter_output_is_a_mismatch():
    result = accuracy.compare_outputs([[1, 2, 3]], [[1, 2]])
    assert not result.passed and "at output token 2" in result.detail


@pytest.fixture(scope="module")
def clean():
    with sim_server() as url:
        yield url


@pytest.fixture(scope="module")
def clean_twin():
    """A second process of the same model: same prompts, same outputs (greedy, fixed dummy weights)."""
    with sim_server() as url:
        yield url


@pytest.fixture(scope="module")
def corrupt():
    with sim_server(faults={"corrupt_rate": 1.0}) as url:
        yield url


@pytest.mark.slow
def test_another_server_of_the_same_model_matches_the_reference(clean, clean_twin):
    result = accuracy.run_gate(SPEC.model_copy(update={"mode": "token-match", "reference": clean}), clean_twin)
    assert result.passed, result.detail
    assert result.metrics["mismatched_prompts"] == 0


@pytest.mark.slow
def test_a_server_of_another_model_fails_against_the_reference(clean):
    """Every output token differs when the deployed model is not the reference's (here V2-Lite vs R1)."""
    with sim_server(overrides=["model.preset=DeepSeek-V2-Lite", "model.quantization=bf16"]) as other:
        result = accuracy.run_gate(SPEC.model_copy(update={"mode": "token-match", "reference": clean}), other)
    assert not result.passed
    assert result.metrics["mismatched_prompts"] == 4
    assert result.detail.startswith("4/4 prompts differ; prompt 0 differs at output token 0")


@pytest.mark.slow
def test_corrupt_outputs_fail_against_reference_url(clean, corrupt):
    result = accuracy.run_gate(SPEC.model_copy(update={"mode": "token-match", "reference": clean}), corrupt)
    assert not result.passed
    assert result.metrics["mismatched_prompts"] == 4


@pytest.mark.slow
def test_recorded_reference_file_round_trip(clean, clean_twin, corrupt, tmp_path):
    ref = tmp_path / "ref.json"
    assert main(["accuracy", "record-reference", "--url", clean, "--out", str(ref),
                 "--accuracy-prompts", "4", "--accuracy-tokens", "8"]) == 0
    record = json.loads(ref.read_text())
    assert len(record["prompts"]) == 4 and all(len(o) == 8 for o in record["outputs"])
    check = ["accuracy", "check", "--accuracy", "token-match", "--accuracy-reference", str(ref), "--url"]
    assert main(check + [clean_twin]) == 0
    assert main(check + [corrupt]) == 1


@pytest.mark.slow
def test_sim_config_without_reference_starts_its_own_aggregated_reference(clean, corrupt, tmp_path):
    cfg = default_sim_config(tmp_path)
    assert accuracy.run_gate(SPEC, clean, cfg).passed
    assert not accuracy.run_gate(SPEC, corrupt, cfg).passed


@pytest.mark.slow
def test_missing_reference_file_says_how_to_record_one(clean, tmp_path):
    spec = SPEC.model_copy(update={"mode": "token-match", "reference": str(tmp_path / "none.json")})
    with pytest.raises(AccuracyGateError, match="accuracy record-reference"):
        accuracy.run_gate(spec, clean)


@pytest.mark.slow
def test_token_match_without_any_reference_outside_the_sim_is_an_error(clean):
    with pytest.raises(AccuracyGateError, match="needs --accuracy-reference"):
        accuracy.run_gate(SPEC.model_copy(update={"mode": "token-match"}), clean, cfg=None)


@pytest.mark.slow
def test_bpb_without_baseline_is_an_error(clean):
    with pytest.raises(AccuracyGateError, match="--accuracy-baseline"):
        accuracy.run_gate(SPEC.model_copy(update={"mode": "bpb"}), clean)


def test_auto_mode_picks_bpb_only_for_real_weights(tmp_path):
    cfg = default_sim_config(tmp_path)
    assert accuracy.resolve_mode(SPEC, cfg) == "token-match"
    real = cfg.model_copy(update={"engine": cfg.engine.model_copy(update={
        "kind": "sglang", "sglang": cfg.engine.sglang.model_copy(update={"load_format": None})})})
    assert accuracy.resolve_mode(SPEC, real) == "bpb"
