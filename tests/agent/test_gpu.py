"""The NVML GPU collector, with NVML replaced by tests/agent/fakenvml/pynvml.py at the import boundary.

There is no GPU on the machines these tests run on; real-GPU output is not recorded here (docs/agent.md).
"""

import pytest
from lockstep_agent.batch import make_batch
from lockstep_agent.gpu import GPUCollector, GPUUnavailable


def open_collector():
    collector = GPUCollector()
    collector.open()
    return collector


def test_reads_every_field_per_gpu_in_base_units(fake_nvml, batch_validator):
    collector = open_collector()
    readings = collector.collect()

    assert [r["gpu"] for r in readings] == [0, 1]
    assert readings[0]["uuid"].startswith("GPU-00000000")
    assert readings[0]["model"] == "NVIDIA H100 80GB HBM3"
    fields = readings[0]["fields"]
    assert fields["DCGM_FI_DEV_GPU_TEMP"] == 41
    assert fields["DCGM_FI_DEV_MEMORY_TEMP"] == 38
    assert fields["DCGM_FI_DEV_POWER_USAGE"] == pytest.approx(312.5)  # NVML's milliwatts -> watts
    assert fields["DCGM_FI_DEV_GPU_UTIL"] == 87
    assert fields["DCGM_FI_DEV_MEM_COPY_UTIL"] == 35
    assert fields["DCGM_FI_DEV_FB_USED"] == 61203283968  # bytes, not dcgm-exporter's MiB
    assert fields["DCGM_FI_DEV_FB_TOTAL"] == 85520809984
    assert fields["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"] == 3
    assert fields["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == 0
    assert fields["DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"] == 17
    assert fields["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] == 2
    assert fields["DCGM_FI_DEV_ROW_REMAP_FAILURE"] == 0
    assert fields["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"] == 0x4
    assert fields["DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"] == 1
    assert fields["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"] == 0
    assert fields["DCGM_FI_DEV_XID_ERRORS"] == 0
    assert fields["DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"] == 0
    assert readings[0]["recovery_action"] == "NONE"
    # Ampere and later have no page retirement: the fields are absent, not zero.
    assert "DCGM_FI_DEV_RETIRED_SBE" not in fields
    assert "DCGM_FI_DEV_RETIRED_PENDING" not in fields

    batch = make_batch(
        node="gpu-001", gpu_status="ok", driver_version=collector.driver_version, readings=readings
    )
    batch_validator.validate(batch)
    assert batch["agent"]["driver_version"] == "550.54.15"


def test_faults_show_in_the_fields(fake_nvml, batch_validator):
    fake_nvml.configure(
        gpus=[
            {
                "ecc": {
                    "corrected_volatile": 90,
                    "uncorrected_volatile": 2,
                    "corrected_aggregate": 400,
                    "uncorrected_aggregate": 5,
                },
                "remapped_rows": [3, 1, 1, 1],
                "throttle_reasons": 0x40 | 0x20,  # HW thermal slowdown + SW thermal slowdown
                "nvlink_totals": {"crc_flit": 12, "crc_data": 4, "replay": 30, "recovery": 2},
                "recovery_action": 2,
            }
        ]
    )
    (reading,) = open_collector().collect()
    fields = reading["fields"]
    assert fields["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == 2
    assert fields["DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"] == 5
    assert fields["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] == 1
    assert fields["DCGM_FI_DEV_ROW_REMAP_PENDING"] == 1
    assert fields["DCGM_FI_DEV_ROW_REMAP_FAILURE"] == 1
    assert fields["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"] == 0x60
    assert fields["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"] == 12
    assert fields["DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"] == 2
    assert reading["recovery_action"] == "NODE_REBOOT"
    batch_validator.validate(make_batch(node="gpu-001", gpu_status="ok", readings=[reading]))


def test_older_driver_without_recovery_action_or_nvlink_totals(fake_nvml):
    """Older drivers lack NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and the *_TOTAL NVLink fields: the action is
    left out, and the NVLink totals are summed from the per-link counters of the active links."""
    fake_nvml.configure(
        gpus=[
            {
                "recovery_action": None,
                "nvlink_totals": None,
                "nvlink_links": {
                    "0": {"crc_flit": 1, "crc_data": 0, "replay": 2, "recovery": 0},
                    "3": {"crc_flit": 4, "crc_data": 1, "replay": 0, "recovery": 1},
                },
                "retired_pages": [[0x1000, 0x2000], [0x3000]],  # a pre-Ampere GPU that retires pages
            }
        ]
    )
    (reading,) = open_collector().collect()
    fields = reading["fields"]
    assert "recovery_action" not in reading
    assert "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION" not in fields
    assert fields["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"] == 5
    assert fields["DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"] == 1
    assert fields["DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"] == 2
    assert fields["DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"] == 1
    assert fields["DCGM_FI_DEV_RETIRED_SBE"] == 2
    assert fields["DCGM_FI_DEV_RETIRED_DBE"] == 1
    assert fields["DCGM_FI_DEV_RETIRED_PENDING"] == 0


def test_an_unsupported_query_leaves_its_fields_out(fake_nvml):
    fake_nvml.configure(gpus=[{"ecc": None, "remapped_rows": None, "nvlink_totals": None}])
    (reading,) = open_collector().collect()
    assert not any(name.startswith("DCGM_FI_DEV_ECC") for name in reading["fields"])
    assert not any("REMAP" in name for name in reading["fields"])
    assert not any("NVLINK" in name for name in reading["fields"])
    assert reading["fields"]["DCGM_FI_DEV_GPU_TEMP"] == 41


def test_xid_events_arrive_through_the_event_set(fake_nvml, batch_validator):
    collector = open_collector()
    fake_nvml.inject_xid(1, 79)  # "GPU has fallen off the bus"
    fake_nvml.inject_xid(0, 48)  # double-bit ECC error
    collector.wait_for_events(0.05)

    readings = collector.collect()
    events = collector.take_events()
    assert [(e["gpu"], e["xid"], e["type"]) for e in events] == [(1, 79, "xid"), (0, 48, "xid")]
    assert events[0]["uuid"] == readings[1]["uuid"]
    # dcgm-exporter semantics: the field holds the last Xid of that GPU.
    assert readings[1]["fields"]["DCGM_FI_DEV_XID_ERRORS"] == 79
    assert readings[0]["fields"]["DCGM_FI_DEV_XID_ERRORS"] == 48
    assert collector.take_events() == []  # each event is sent once
    batch_validator.validate(make_batch(node="gpu-001", gpu_status="ok", readings=readings, events=events))


def test_an_xid_queued_before_collection_is_not_missed(fake_nvml):
    collector = open_collector()
    fake_nvml.inject_xid(0, 94)
    readings = collector.collect()  # drains the event set without waiting
    assert readings[0]["fields"]["DCGM_FI_DEV_XID_ERRORS"] == 94
    assert [e["xid"] for e in collector.take_events()] == [94]


def test_a_gpu_that_cannot_register_for_events_still_reports(fake_nvml):
    fake_nvml.configure(gpus=[{"xid_events": False}, {}])
    collector = open_collector()
    assert len(collector.collect()) == 2


def test_wait_for_events_waits_the_whole_time_when_nothing_happens(fake_nvml):
    import time

    collector = open_collector()
    started = time.monotonic()
    collector.wait_for_events(0.2)
    assert time.monotonic() - started >= 0.19


@pytest.mark.parametrize(
    ("fail", "status", "words"),
    [
        ("library_not_found", "no_nvml", "Library Not Found"),
        ("driver_not_loaded", "no_nvml", "Driver Not Loaded"),
    ],
)
def test_no_nvml_is_reported_with_the_reason(fake_nvml, fail, status, words):
    fake_nvml.configure(fail=fail)
    with pytest.raises(GPUUnavailable) as raised:
        open_collector()
    assert raised.value.status == status
    assert words in raised.value.reason


def test_a_gpu_that_fell_off_the_bus_is_left_out_and_the_rest_are_read(fake_nvml, caplog):
    fake_nvml.configure(gpus=[{}, {"lost": True}, {}])
    readings = open_collector().collect()
    assert [r["gpu"] for r in readings] == [0, 2]
    assert "GPU 1 cannot be opened" in caplog.text

    fake_nvml.configure(gpus=[{"lost": True}])
    with pytest.raises(GPUUnavailable) as raised:
        open_collector()
    assert raised.value.status == "no_gpus"


def test_nvml_without_gpus(fake_nvml):
    fake_nvml.configure(gpus=[])
    with pytest.raises(GPUUnavailable) as raised:
        open_collector()
    assert raised.value.status == "no_gpus"


def test_the_real_nvml_on_this_machine_says_why_it_cannot_read():
    """nvidia-ml-py itself, on a machine without the NVIDIA driver, fails to open with a reason."""
    import pynvml

    if getattr(pynvml, "__file__", "").endswith("fakenvml/pynvml.py"):
        pytest.skip("the fake is on the path")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - only on a GPU machine
        pynvml.nvmlShutdown()
        pytest.skip("this machine has NVML; the no-GPU path cannot be seen here")
    with pytest.raises(GPUUnavailable) as raised:
        GPUCollector(nvml=pynvml).open()
    assert raised.value.status == "no_nvml"
