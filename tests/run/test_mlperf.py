"""MLPerf LoadGen harness: dataset formats, and Offline/Server runs of LoadGen through the PD router."""

from __future__ import annotations

import json
import pickle

import pytest

from orchestrator.cli import main
from orchestrator.run import mlperf
from tests.support import sim_server

pytest.importorskip("mlperf_loadgen")


# ------------------------------------------------------------------------------------------ dataset formats


def test_json_records_take_input_ids_or_text(tmp_path):
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps([{"input_ids": [5, 6, 7], "output_len": 9}, {"text": "Hello world"}]))
    samples = mlperf.load_samples(path, max_output_tokens=12)
    assert samples[0].input_ids == [5, 6, 7] and samples[0].output_len == 9
    assert samples[1].input_ids and samples[1].output_len == 12  # text was tokenized here
    assert [s.index for s in samples] == [0, 1]


def test_pandas_column_json_in_mlperf_deepseek_shape(tmp_path):
    # DataFrame.to_json() default orient: {column: {row: value}}; MLPerf's columns are tok_input/text_input
    path = tmp_path / "mlperf.json"
    path.write_text(json.dumps({
        "tok_input": {"0": [1, 2, 3], "1": [4, 5]},
        "text_input": {"0": "a", "1": "b"},
        "dataset": {"0": "gpqa", "1": "math500"},
    }))
    samples = mlperf.load_samples(path, max_output_tokens=20)
    assert [s.input_ids for s in samples] == [[1, 2, 3], [4, 5]]
    assert all(s.output_len == 20 for s in samples)


def test_pickle_of_records_and_limit(tmp_path):
    path = tmp_path / "prompts.pkl"
    path.write_bytes(pickle.dumps([{"tok_input": [i, i + 1]} for i in range(10)]))
    samples = mlperf.load_samples(path, limit=3)
    assert [s.input_ids for s in samples] == [[0, 1], [1, 2], [2, 3]]


def test_record_without_prompt_columns_is_named(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"question": "why?"}]))
    with pytest.raises(mlperf.MlperfError, match="record 0 has none of .*tok_input.*keys are \\['question'\\]"):
        mlperf.load_samples(path)


def test_missing_dataset_file_is_named(tmp_path):
    with pytest.raises(mlperf.MlperfError, match="no such file"):
        mlperf.load_samples(tmp_path / "nope.pkl")


# ------------------------------------------------------------------------------------------ LoadGen runs


@pytest.fixture(scope="module")
def server(pd_router):
    """LoadGen's queries go through the PD router's ingress to a sim prefill + decode pair."""
    return pd_router


def _prompts(tmp_path, n: int = 6) -> str:
    path = tmp_path / "prompts.json"
    records = [{"input_ids": list(range(100 + i, 140 + 3 * i)), "output_len": 6 + i} for i in range(n)]
    path.write_text(json.dumps(records))
    return str(path)


def test_offline_run_completes_every_sample_and_keeps_loadgen_logs(server, tmp_path):
    out = tmp_path / "offline"
    rc = main(["mlperf", "--url", server, "--dataset", _prompts(tmp_path), "--scenario", "Offline",
               "--min-duration-s", "0", "--out", str(out)])
    assert rc == 0
    report = json.loads((out / "mlperf_run.json").read_text())
    assert report["sut"]["completed"] == report["sut"]["issued"] >= 6
    assert report["sut"]["failed"] == 0
    assert report["sut"]["output_tokens"] >= sum(6 + i for i in range(6))
    assert report["loadgen_summary"]["Scenario"] == "Offline"
    assert report["loadgen_summary"]["Result is"] == "VALID"
    for name in ("mlperf_log_summary.txt", "mlperf_log_detail.txt", "mlperf_log_accuracy.json"):
        assert (out / name).exists(), name


def test_server_scenario_reports_first_tokens(server, tmp_path):
    out = tmp_path / "server"
    rc = main(["mlperf", "--url", server, "--dataset", _prompts(tmp_path), "--scenario", "Server",
               "--target-qps", "50", "--min-duration-s", "0", "--out", str(out)])
    assert rc == 0
    summary = (out / "mlperf_log_summary.txt").read_text()
    assert "Scenario : Server" in summary
    assert "First Token latency" in summary  # LoadGen saw FirstTokenComplete for the queries


@pytest.mark.slow
def test_failed_requests_make_the_command_fail(tmp_path):
    with sim_server(faults={"error_rate": 1.0}) as url:
        out = tmp_path / "errors"
        rc = main(["mlperf", "--url", url, "--dataset", _prompts(tmp_path, 3), "--min-duration-s", "0",
                   "--out", str(out)])
    assert rc == 1
    report = json.loads((out / "mlperf_run.json").read_text())
    assert report["sut"]["failed"] == report["sut"]["issued"] and "500" in report["sut"]["first_error"]


def test_accuracy_mode_logs_exactly_the_tokens_the_router_returned(server, tmp_path):
    import numpy as np

    from orchestrator.run.accuracy import greedy_outputs

    dataset = _prompts(tmp_path, 3)
    out = tmp_path / "accuracy"
    assert main(["mlperf", "--url", server, "--dataset", dataset, "--accuracy-log", "--min-duration-s", "0",
                 "--out", str(out)]) == 0
    logged = json.loads((out / "mlperf_log_accuracy.json").read_text())
    assert sorted(e["qsl_idx"] for e in logged) == [0, 1, 2]  # AccuracyOnly: every sample once
    records = json.loads(open(dataset).read())
    for entry in logged:
        record = records[entry["qsl_idx"]]
        tokens = np.frombuffer(bytes.fromhex(entry["data"]), dtype=np.int32).tolist()
        assert tokens == greedy_outputs(server, [record["input_ids"]], record["output_len"])[0]
        assert entry["token_count"] == record["output_len"]
