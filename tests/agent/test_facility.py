"""The Redfish facility collector, against sushy-tools' emulator (a real Redfish server) and, for what the
emulator does not serve, recorded responses in the shape of DMTF's mockups served over HTTP."""

import json

import pytest
import requests
from lockstep_agent.batch import make_batch
from lockstep_agent.facility import FacilityCollector, RedfishSource, load_sources

from tests.support.agent import batches_in, run_agent


def points_by(points, metric):
    return [p for p in points if p["metric"] == metric]


def test_chassis_thermal_from_the_sushy_emulator(sushy_emulator, batch_validator):
    points = FacilityCollector([RedfishSource(url=sushy_emulator, target="gpu-001")]).collect()

    (inlet,) = points_by(points, "inlet_temperature_celsius")
    assert inlet["value"] == 25
    assert inlet["sensor"] == "Chassis Intake Temp"
    assert inlet["scope"] == "node" and inlet["target"] == "gpu-001" and inlet["source"] == "redfish"
    assert inlet["health"] == "OK" and inlet["state"] == "Enabled"
    assert inlet["device"].startswith("/redfish/v1/Chassis/")
    (cpu,) = points_by(points, "temperature_celsius")
    assert cpu["value"] == 41 and cpu["sensor"] == "CPU Temp"
    fans = points_by(points, "fan_speed_rpm")
    assert sorted((f["sensor"], f["value"]) for f in fans) == [
        ("BaseBoard System Fan", 2100),
        ("BaseBoard System Fan Backup", 2050),
    ]
    batch_validator.validate(make_batch(node="gpu-001", gpu_status="ok", facility=points))


def test_what_the_sushy_emulator_does_not_serve(sushy_emulator):
    """Why part of the collector is tested against recorded responses: the emulator (fake driver) has no
    chassis Power resource, no exhaust temperature, and no CDUs or PDUs."""
    root = requests.get(f"{sushy_emulator}/redfish/v1/", timeout=5).json()
    assert "PowerEquipment" not in root and "ThermalEquipment" not in root
    chassis_uri = requests.get(f"{sushy_emulator}/redfish/v1/Chassis", timeout=5).json()["Members"][0][
        "@odata.id"
    ]
    chassis = requests.get(f"{sushy_emulator}{chassis_uri}", timeout=5).json()
    assert "Thermal" in chassis and "Power" not in chassis
    assert requests.get(f"{sushy_emulator}{chassis_uri}/Power", timeout=5).status_code == 404
    thermal = requests.get(f"{sushy_emulator}{chassis_uri}/Thermal", timeout=5).json()
    assert {t.get("PhysicalContext") for t in thermal["Temperatures"]} == {"CPU", "Intake"}


def test_chassis_thermal_and_power_from_recorded_responses(redfish_mockup, batch_validator):
    every = FacilityCollector([RedfishSource(url=redfish_mockup, target="gpu-001")]).collect()
    points = [p for p in every if p["device"] == "/redfish/v1/Chassis/1U"]

    assert [p["value"] for p in points_by(points, "inlet_temperature_celsius")] == [24.5]
    (exhaust,) = points_by(points, "exhaust_temperature_celsius")
    assert exhaust["value"] == 52 and exhaust["health"] == "Warning"
    assert not any(p.get("sensor") == "GPU Tray Temp" for p in points)  # Absent: skipped
    assert [p["value"] for p in points_by(points, "fan_speed_rpm")] == [2100]
    assert [p["value"] for p in points_by(points, "fan_speed_percent")] == [65]
    assert [p["value"] for p in points_by(points, "power_draw_watts")] == [8000]

    supplies = {p["sensor"]: p for p in points_by(points, "psu_ok")}
    assert sorted(supplies) == ["Power Supply Bay 1", "Power Supply Bay 2"]  # bay 3 is Absent
    assert supplies["Power Supply Bay 1"]["value"] == 1
    assert supplies["Power Supply Bay 2"]["value"] == 0
    assert supplies["Power Supply Bay 2"]["health"] == "Critical"
    assert supplies["Power Supply Bay 2"]["state"] == "UnavailableOffline"
    assert [
        p["value"] for p in points_by(points, "psu_input_watts") if p["sensor"] == "Power Supply Bay 1"
    ] == [2750]
    assert [
        p["value"] for p in points_by(points, "psu_output_watts") if p["sensor"] == "Power Supply Bay 1"
    ] == [2640]
    batch_validator.validate(make_batch(node="gpu-001", gpu_status="ok", facility=every))


def test_a_chassis_with_only_the_newer_subsystem_resources(redfish_mockup):
    """BMCs that dropped the deprecated Thermal and Power resources: ThermalSubsystem (ThermalMetrics,
    Fans), PowerSubsystem (PowerSupplies and their Metrics) and EnvironmentMetrics."""
    every = FacilityCollector([RedfishSource(url=redfish_mockup, target="gpu-001")]).collect()
    points = [p for p in every if p["device"] == "/redfish/v1/Chassis/GPUTray"]

    assert [p["value"] for p in points_by(points, "inlet_temperature_celsius")] == [27.0]
    assert [p["value"] for p in points_by(points, "exhaust_temperature_celsius")] == [58.5]
    assert [(p["sensor"], p["value"]) for p in points_by(points, "temperature_celsius")] == [
        ("GPU_SXM_1", 61.0)
    ]
    assert [(p["sensor"], p["value"]) for p in points_by(points, "fan_speed_percent")] == [("Fan Bay 1", 72)]
    assert [(p["sensor"], p["value"]) for p in points_by(points, "fan_speed_rpm")] == [("Fan Bay 1", 9800)]
    assert {p["sensor"]: p["value"] for p in points_by(points, "psu_ok")} == {
        "Tray PSU 0": 1,
        "Tray PSU 1": 0,
    }
    assert [p["value"] for p in points_by(points, "psu_input_watts")] == [3100.0]
    assert [p["value"] for p in points_by(points, "psu_output_watts")] == [2950.0]
    assert [p["value"] for p in points_by(points, "power_draw_watts")] == [5600.0]


def write_config(tmp_path, redfish_mockup, **extra):
    config = {
        "cdus": [{"url": redfish_mockup, "path": "/redfish/v1/ThermalEquipment/CDUs/1", "row": "A"}],
        "pdus": [{"url": redfish_mockup, "path": "/redfish/v1/PowerEquipment/RackPDUs/1", "rack": "R12"}],
        **extra,
    }
    path = tmp_path / "facility.json"
    path.write_text(json.dumps(config))
    return path


def test_cdu_loop_pressure_and_flow_in_base_units(redfish_mockup, tmp_path, batch_validator):
    sources = load_sources(str(write_config(tmp_path, redfish_mockup)), default_node="gpu-001")
    points = FacilityCollector([s for s in sources if s.kind == "cdu"]).collect()
    assert {(p["scope"], p["target"]) for p in points} == {("row", "A")}

    def value(metric, sensor):
        (point,) = [p for p in points if p["metric"] == metric and p["sensor"] == sensor]
        return point["value"]

    assert value("cdu_supply_pressure_pascals", "primary/A") == pytest.approx(310_000)
    assert value("cdu_return_pressure_pascals", "primary/A") == pytest.approx(215_000)
    assert value("cdu_differential_pressure_pascals", "secondary/B") == pytest.approx(62_500)
    assert value("cdu_flow_cubic_meters_per_second", "primary/A") == pytest.approx(1500 / 60000)  # 1500 L/min
    assert value("cdu_flow_cubic_meters_per_second", "secondary/B") == pytest.approx(0.02)
    assert value("cdu_return_temperature_celsius", "secondary/B") == 41
    # The secondary return pressure sensor has no reading: no point, rather than a made-up zero.
    assert not [
        p for p in points if p["metric"] == "cdu_return_pressure_pascals" and p["sensor"] == "secondary/B"
    ]
    assert {p["health"] for p in points if p["sensor"] == "secondary/B"} == {"Warning"}
    batch_validator.validate(make_batch(node=None, gpu_status="disabled", facility=points))


def test_pdu_current_per_rack(redfish_mockup, tmp_path, batch_validator):
    sources = load_sources(str(write_config(tmp_path, redfish_mockup)), default_node="gpu-001")
    points = FacilityCollector([s for s in sources if s.kind == "pdu"]).collect()
    assert {(p["scope"], p["target"]) for p in points} == {("rack", "R12")}
    currents = {p["sensor"]: p["value"] for p in points_by(points, "pdu_current_amperes")}
    assert currents == {"AC1": 41.2, "AC1/Line1": 13.9, "AC1/Line2": 13.6, "AC1/Line3": 13.7}
    assert [p["value"] for p in points_by(points, "pdu_voltage_volts")] == [230.1]
    assert sorted(p["sensor"] for p in points_by(points, "pdu_power_watts")) == ["AC1", "total"]
    batch_validator.validate(make_batch(node=None, gpu_status="disabled", facility=points))


def test_an_unreachable_source_is_skipped_and_the_rest_are_read(redfish_mockup, sushy_emulator, caplog):
    from tests.support.agent import free_port

    dead = RedfishSource(url=f"http://127.0.0.1:{free_port()}", target="gpu-009", timeout=1)
    points = FacilityCollector([dead, RedfishSource(url=sushy_emulator, target="gpu-001")]).collect()
    assert {p["target"] for p in points} == {"gpu-001"}
    assert "unreachable or refused" in caplog.text


def test_the_command_sends_facility_series(redfish_mockup, sushy_emulator, sysfs, tmp_path, batch_validator):
    config = write_config(tmp_path, redfish_mockup, bmcs=[{"url": redfish_mockup, "node": "gpu-001"}])
    result = run_agent(
        "--once",
        "--dry-run",
        "--node",
        "gpu-001",
        "--sysfs-root",
        str(sysfs),
        "--facility-config",
        str(config),
        "--redfish-url",
        sushy_emulator,
        fake_nvml={},
    )
    assert result.returncode == 0, result.stderr
    (batch,) = batches_in(result.stdout)
    batch_validator.validate(batch)
    metrics = {p["metric"] for p in batch["facility"]}
    assert {
        "inlet_temperature_celsius",
        "exhaust_temperature_celsius",
        "fan_speed_rpm",
        "power_draw_watts",
        "psu_ok",
        "cdu_supply_pressure_pascals",
        "cdu_flow_cubic_meters_per_second",
        "pdu_current_amperes",
    } <= metrics
    assert {p["scope"] for p in batch["facility"]} == {"node", "rack", "row"}


def test_bmc_credentials_with_basic_auth(sushy_emulator_with_auth, caplog):
    assert requests.get(f"{sushy_emulator_with_auth}/redfish/v1/Chassis", timeout=5).status_code == 401
    good = RedfishSource(
        url=sushy_emulator_with_auth, target="gpu-001", username="lockstep", password="bmc-secret-1"
    )
    assert points_by(FacilityCollector([good]).collect(), "inlet_temperature_celsius")

    wrong = RedfishSource(
        url=sushy_emulator_with_auth, target="gpu-001", username="lockstep", password="nope"
    )
    assert FacilityCollector([wrong]).collect() == []
    assert "Invalid credentials" in caplog.text


def test_credentials_from_the_environment_in_the_config_file(tmp_path, monkeypatch):
    monkeypatch.setenv("BMC_PASSWORD", "from-env")
    path = tmp_path / "facility.json"
    path.write_text(
        json.dumps(
            {"bmcs": [{"url": "https://127.0.0.1:1", "username": "root", "password_env": "BMC_PASSWORD"}]}
        )
    )
    (source,) = load_sources(str(path), default_node="gpu-007")
    assert (source.kind, source.scope, source.target, source.username, source.password) == (
        "bmc",
        "node",
        "gpu-007",
        "root",
        "from-env",
    )
