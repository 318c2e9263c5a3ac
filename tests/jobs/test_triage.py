"""Triage from NVIDIA's Xid catalogue (its recommended_action column), and NIC counters."""

import pytest

from jobs.triage import NicFaultDetails, catalogue, classify_fault, classify_nic, classify_xid


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68])
def test_application_errors_leave_the_hardware_healthy(xid):
    verdict = classify_xid(xid)
    assert verdict.application and not verdict.out_of_service and not verdict.escalates
    assert verdict.recommended_action in ("RESTART_APP", "IGNORE", "WORKFLOW_XID_45")


def test_contained_error_restarts_the_app_and_counts_toward_escalation():
    verdict = classify_xid(94)
    assert verdict.recommended_action == "RESTART_APP" and verdict.application
    assert verdict.escalates and not verdict.out_of_service


@pytest.mark.parametrize(
    "xid,action",
    [
        (48, "WORKFLOW_XID_48"),
        (74, "WORKFLOW_NVLINK_ERR"),
        (79, "RESTART_BM"),
        (95, "RESET_GPU"),
        (119, "RESET_GPU"),
    ],
)
def test_reset_reboot_and_workflow_codes_take_the_gpu_out_of_service(xid, action):
    verdict = classify_xid(xid)
    assert verdict.out_of_service and verdict.escalates and verdict.recommended_action == action


def test_every_reset_code_in_the_catalogue_is_out_of_service():
    rows = catalogue()
    reset = [code for code, row in rows.items() if row["recommended_action"] == "RESET_GPU"]
    assert len(reset) >= 10
    assert all(classify_xid(code).out_of_service for code in reset)
    assert all(classify_xid(code).remediation == "gpu_reset" for code in reset)


def test_codes_without_a_recommended_action_are_kept_escalate_and_need_a_human():
    rows = catalogue()
    blank = [code for code, row in rows.items() if not row["recommended_action"]]
    assert 167 in blank
    for code in blank:
        verdict = classify_xid(code)
        assert verdict.escalates and verdict.needs_human and not verdict.out_of_service


def test_triage_is_read_from_the_catalogue_at_run_time():
    changed = {13: {"xid": "13", "mnemonic": "X", "meaning": "m", "recommended_action": "RESET_GPU"}}
    assert classify_xid(13, rows=changed).out_of_service
    assert classify_xid(999).needs_human and not classify_xid(999).in_catalogue


def test_uncorrectable_ecc_takes_the_gpu_out():
    verdict = classify_fault("ecc_uncorrectable")
    assert verdict.out_of_service and verdict.job_impact == "device" and verdict.remediation == "gpu_reset"


def test_fault_kinds_map_to_job_impacts():
    assert classify_fault("node_unreachable").job_impact == "node"
    assert classify_fault("gpu_xid", xid=79).job_impact == "device"
    assert classify_fault("gpu_xid", xid=13).job_impact == "restart"
    assert classify_fault("gpu_xid", xid=43).ignore
    assert classify_fault("software_crash").job_impact == "restart"
    assert classify_fault("predicted_failure").job_impact == "risk"
    assert classify_fault("thermal").job_impact == "none" and classify_fault("thermal").escalates


def test_nic_counters():
    assert classify_nic({"link_downed": 1}) == "fatal"
    assert classify_nic({"link_state": "down"}) == "fatal"
    assert classify_nic({"link_downed": 0, "symbol_rate_per_hour": 5000}) == "degraded"
    assert classify_nic({"link_error_recoveries": 3}) == "degraded"
    assert classify_nic({"link_error_recoveries": 1, "symbol_rate_per_hour": 1}) == "ok"
    assert (
        classify_nic({"symbol_rate_per_hour": "nan"}, kind="link_degraded") == "degraded"
    )  # unreadable: the kind


def test_ingest_and_triage_share_one_definition_of_nic_details():
    """The details ingest writes for a link whose symbol errors rise (link up) make triage call it degraded:
    the gap where ingest wrote ``symbol_rate_per_hour`` and triage read ``symbol_error_rate``."""
    from telemetry import extract

    state, found = extract.nic_step(
        None,
        1000.0,
        "up",
        {"symbol_error": 0, "link_error_recovery": 0, "link_downed": 0},
        symbol_rate_limit=100.0,
    )
    assert found == []
    state, found = extract.nic_step(
        state,
        1005.0,
        "up",
        {"symbol_error": 100, "link_error_recovery": 0, "link_downed": 0},
        symbol_rate_limit=100.0,
    )
    assert [kind for kind, _ in found] == ["link_degraded"]
    kind, details = found[0]
    assert set(details) <= set(NicFaultDetails.KEYS) and details["symbol_rate_per_hour"] > 100
    assert classify_fault(kind, details=details).job_impact == "degraded"
    assert state["errors_at"] == 1005.0
    # Cumulative downtime weighs more than the number of flaps.
    assert classify_nic({"flaps": 1, "downtime_seconds": 120}) == "fatal"
    assert classify_nic({"flaps": 10, "downtime_seconds": 2}) == "degraded"
    assert classify_nic({}, kind="nic_down") == "fatal"
    assert classify_nic({}, kind="link_flap") == "degraded"
