"""`serve apply`'s checks, before anything is touched: what a live change may alter (a group's count, new or removed
groups), the one-line refusals for anything else, and which replica applications a change adds and removes."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.run.serving.changes import ChangeRefused, new_config, plan_change

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def running():
    return load_config(ROOT / "configs" / "qwen3-pd-2026.yaml", ["router.port=18123"])


def test_a_count_change_adds_and_removes_the_highest_replicas(running):
    change = plan_change(running, new_config(running, None, ["layout.prefill.0.count=1", "layout.decode.0.count=3"]))
    assert [a.app_name for a in change.added] == ["workers-decode-0-2"]
    assert [(a.app_name, a.worker_name) for a in change.removed] == [("workers-prefill-0-1", "prefill-0/1")]


def test_a_new_group_on_the_other_role_s_node_is_a_live_change(running):
    new = new_config(running, None, ["layout.prefill.0.count=1",
                                     "layout.decode.+={count: 1, tp: 4, ep: 4, node_role: prefill}"])
    change = plan_change(running, new)
    assert [(a.app_name, a.worker_name, a.group_index) for a in change.added] == [
        ("workers-decode-1-0", "decode-1/0", 1)]


def test_the_running_port_and_name_stay_when_a_file_is_applied(running):
    text = (ROOT / "configs" / "qwen3-pd-2026.yaml").read_text()
    new = new_config(running.model_copy(update={"name": "svc"}), text, ["layout.decode.0.count=1"])
    assert (new.name, new.router.port, new.layout.decode[0].count) == ("svc", 18123, 1)


@pytest.mark.parametrize("overrides, words", [
    (["layout.decode.0.max_running_requests=128"],
     "layout.decode.0 (decode-0): only count may change on a running group (max_running_requests differ)"),
    (["layout.decode.0.tp=8"], "apply: layout.decode.0: ep=4"),
    (["router.policy=round_robin"], "router: differs from the running service's"),
    (["router.port=18124"], "router: differs from the running service's"),  # was dropped: 'nothing to do'
    (["layout.decode.0.count=0"], "layout.decode.0.count"),
    (["layout.decode.7.count=2"], "layout.decode has 1 item(s)"),
])
def test_anything_else_is_refused_in_one_line_naming_the_field(running, overrides, words):
    with pytest.raises(ChangeRefused) as refused:
        plan_change(running, new_config(running, None, overrides))
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_a_file_that_is_not_yaml_is_refused(running):
    with pytest.raises(ChangeRefused, match="not valid YAML"):
        new_config(running, "layout: [", [])


def test_a_starting_service_answers_status_and_refuses_apply_on_its_own_user_s_socket(running, tmp_path):
    import stat

    from orchestrator.run.serving.control import ControlServer, ServiceNotFound, find_service, service_status
    from orchestrator.run.serving.control import stream_control
    from orchestrator.run.serving.service import Service

    said: list[str] = []
    control = ControlServer(Service(running, 30.0, said.append), tmp_path)
    try:
        state = find_service(tmp_path, None)
        assert stat.S_IMODE(Path(state["socket"]).stat().st_mode) == 0o600
        status = service_status(state)
        assert (status["phase"], status["layout"], status["workers"]) == ("starting", "2PxTP4/2DxTP4", [])
        items = list(stream_control(state, "/apply", {"overrides": ["layout.decode.0.count=3"]}, 30))
        assert items[-1] == {"ok": False} and "apply refused: the service is starting" in items[0]["line"]
        assert said == [items[0]["line"]]  # the service's own output says it too
    finally:
        control.close()
    with pytest.raises(ServiceNotFound, match="no service runs"):
        find_service(tmp_path, None)
