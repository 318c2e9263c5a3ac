"""Facility telemetry through Redfish, with DMTF's python-redfish-library (the ``redfish`` extra).

Three kinds of source, each polled with one Redfish client:

- a BMC: every chassis's Thermal (inlet, exhaust and other temperatures, fan speeds) and Power (power
  draw, power supply state and input/output watts), or, where a BMC has only the newer resources,
  ThermalSubsystem (ThermalMetrics, Fans), PowerSubsystem (PowerSupplies and their Metrics) and
  EnvironmentMetrics (power draw); series scoped to a node;
- a CDU (Redfish CoolingUnit, e.g. /redfish/v1/ThermalEquipment/CDUs/1): the coolant connectors' supply
  and return pressure, differential pressure, flow and temperatures; series scoped to a rack or row;
- a rack PDU (Redfish PowerDistribution, e.g. /redfish/v1/PowerEquipment/RackPDUs/1): mains circuit
  current (per phase where given), voltage and power, and the PDU's total power; scoped to a rack or row.

Every value becomes one facility series point (docs/ingest-schema.md) in base units: kPa -> Pa,
L/min -> m^3/s. A sensor without a reading, or marked Absent, is skipped.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

KIND_BMC, KIND_CDU, KIND_PDU = "bmc", "cdu", "pdu"


@dataclass
class RedfishSource:
    """One Redfish service to poll, and what its readings are about."""

    url: str  # the service's base URL, e.g. https://10.0.0.5
    kind: str = KIND_BMC
    scope: str = "node"  # node | rack | row
    target: str = ""  # the node hostname, rack or row name
    path: str | None = None  # the CDU or PDU resource; BMCs walk /redfish/v1/Chassis
    username: str | None = None
    password: str | None = None
    auth: str = "basic"  # basic | session (ignored without a username)
    timeout: float = 5.0
    extra: dict = field(default_factory=dict)


def load_sources(path: str, *, default_node: str | None) -> list[RedfishSource]:
    """Sources from a JSON file: {"bmcs": [...], "cdus": [...], "pdus": [...]} (docs/agent.md)."""
    with open(path) as handle:
        config = json.load(handle)
    sources = []
    for kind, key in ((KIND_BMC, "bmcs"), (KIND_CDU, "cdus"), (KIND_PDU, "pdus")):
        for entry in config.get(key, []):
            if "row" in entry:
                scope, target = "row", entry["row"]
            elif "rack" in entry:
                scope, target = "rack", entry["rack"]
            else:
                scope, target = "node", entry.get("node") or default_node or ""
            password = entry.get("password")
            if entry.get("password_env"):
                password = os.environ.get(entry["password_env"])
            sources.append(
                RedfishSource(
                    url=entry["url"],
                    kind=kind,
                    scope=scope,
                    target=target,
                    path=entry.get("path"),
                    username=entry.get("username"),
                    password=password,
                    auth=entry.get("auth", "basic"),
                    timeout=float(entry.get("timeout", 5.0)),
                )
            )
    return sources


class RedfishError(Exception):
    pass


class _Client:
    """A thin reader over redfish.redfish_client: GET a URI, get its JSON or a RedfishError."""

    def __init__(self, source: RedfishSource):
        try:
            import redfish
        except ImportError as error:  # pragma: no cover - the extra is installed with the agent in tests
            raise RedfishError(
                "the redfish package is not installed: pip install 'lockstep-agent[redfish]'"
            ) from error
        try:
            self._client = redfish.redfish_client(
                base_url=source.url,
                username=source.username,
                password=source.password,
                default_prefix="/redfish/v1/",
                timeout=source.timeout,
                max_retry=1,
            )
            if source.username:
                self._client.login(auth=source.auth)
        except Exception as error:  # the library raises its own hierarchy and requests' errors
            raise RedfishError(f"{source.url}: {error}") from error
        self._source = source
        self._logged_in = bool(source.username)

    def get(self, uri: str) -> dict:
        try:
            response = self._client.get(uri)
        except Exception as error:
            raise RedfishError(f"{self._source.url}{uri}: {error}") from error
        if response.status != 200:
            raise RedfishError(f"{self._source.url}{uri}: HTTP {response.status}")
        return response.dict

    def close(self) -> None:
        if self._logged_in:
            try:
                self._client.logout()
            except Exception:  # a BMC that drops the session first is no reason to fail the poll
                pass


def _link(resource: dict, key: str) -> str | None:
    return (resource.get(key) or {}).get("@odata.id")


def _reading(value: Any) -> float | None:
    """A number, or a Redfish sensor excerpt {"Reading": n}; None when there is no reading."""
    if isinstance(value, dict):
        value = value.get("Reading")
    if isinstance(value, bool) or value is None:
        return None
    return float(value) if isinstance(value, int | float) else None


def _status(item: dict) -> tuple[str | None, str | None]:
    status = item.get("Status") or {}
    return status.get("State"), status.get("Health")


class FacilityCollector:
    """Polls each source once per collect(); a source that fails is logged and skipped this round."""

    def __init__(self, sources: list[RedfishSource]):
        self.sources = sources

    def collect(self) -> list[dict]:
        points: list[dict] = []
        for source in self.sources:
            try:
                client = _Client(source)
            except RedfishError as error:
                log.warning("Redfish source skipped this round (unreachable or refused): %s", error)
                continue
            try:
                if source.kind == KIND_BMC:
                    points.extend(self._bmc(client, source))
                elif source.kind == KIND_CDU:
                    points.extend(self._cdu(client, source))
                elif source.kind == KIND_PDU:
                    points.extend(self._pdu(client, source))
            except RedfishError as error:
                log.warning("Redfish poll failed: %s", error)
            finally:
                client.close()
        return points

    @staticmethod
    def _point(source, device, metric, value, *, sensor=None, item=None) -> dict:
        point = {
            "ts": time.time(),
            "source": "redfish",
            "scope": source.scope,
            "target": source.target,
            "device": device,
            "metric": metric,
            "value": value,
        }
        if sensor:
            point["sensor"] = str(sensor)[:200]
        if item is not None:
            state, health = _status(item)
            if state is not None:
                point["state"] = state
            if health in ("OK", "Warning", "Critical"):
                point["health"] = health
        return point

    # --- BMC: chassis Thermal and Power ----------------------------------------------------------------------

    def _bmc(self, client: _Client, source: RedfishSource) -> list[dict]:
        points = []
        collection = client.get("/redfish/v1/Chassis")
        for member in collection.get("Members", []):
            uri = member["@odata.id"]
            chassis = client.get(uri)
            thermal = _link(chassis, "Thermal")
            power = _link(chassis, "Power")
            # Legacy Thermal/Power where the BMC has them; else the newer ThermalSubsystem/PowerSubsystem.
            if thermal:
                points.extend(self._thermal(client.get(thermal), source, uri))
            elif _link(chassis, "ThermalSubsystem"):
                points.extend(
                    self._thermal_subsystem(
                        client, client.get(_link(chassis, "ThermalSubsystem")), source, uri
                    )
                )
            if power:
                points.extend(self._power(client.get(power), source, uri))
            else:
                if _link(chassis, "PowerSubsystem"):
                    points.extend(
                        self._power_subsystem(
                            client, client.get(_link(chassis, "PowerSubsystem")), source, uri
                        )
                    )
                if _link(chassis, "EnvironmentMetrics"):
                    value = _reading(client.get(_link(chassis, "EnvironmentMetrics")).get("PowerWatts"))
                    if value is not None:
                        points.append(
                            self._point(source, uri, "power_draw_watts", value, sensor="EnvironmentMetrics")
                        )
        return points

    def _thermal_subsystem(
        self, client: _Client, subsystem: dict, source: RedfishSource, device: str
    ) -> list[dict]:
        points = []
        metrics = _link(subsystem, "ThermalMetrics")
        if metrics:
            thermal = client.get(metrics)
            summary = thermal.get("TemperatureSummaryCelsius") or {}
            for key, metric in (
                ("Intake", "inlet_temperature_celsius"),
                ("Exhaust", "exhaust_temperature_celsius"),
            ):
                value = _reading(summary.get(key))
                if value is None and key == "Intake":
                    value = _reading(summary.get("Ambient"))
                if value is not None:
                    points.append(
                        self._point(source, device, metric, value, sensor=f"TemperatureSummaryCelsius/{key}")
                    )
            for item in thermal.get("TemperatureReadingsCelsius") or []:
                value = _reading(item)
                if value is not None:
                    name = item.get("DeviceName") or item.get("DataSourceUri")
                    points.append(self._point(source, device, "temperature_celsius", value, sensor=name))
        fans = _link(subsystem, "Fans")
        for member in client.get(fans).get("Members", []) if fans else []:
            fan = client.get(member["@odata.id"])
            if _status(fan)[0] == "Absent":
                continue
            speed = fan.get("SpeedPercent") or {}
            name = fan.get("Name") or fan.get("Id")
            if _reading(speed) is not None:
                points.append(
                    self._point(source, device, "fan_speed_percent", _reading(speed), sensor=name, item=fan)
                )
            if _reading(speed.get("SpeedRPM")) is not None:
                points.append(
                    self._point(
                        source,
                        device,
                        "fan_speed_rpm",
                        _reading(speed.get("SpeedRPM")),
                        sensor=name,
                        item=fan,
                    )
                )
        return points

    def _power_subsystem(
        self, client: _Client, subsystem: dict, source: RedfishSource, device: str
    ) -> list[dict]:
        points = []
        supplies = _link(subsystem, "PowerSupplies")
        for member in client.get(supplies).get("Members", []) if supplies else []:
            supply = client.get(member["@odata.id"])
            state, health = _status(supply)
            if state == "Absent":
                continue
            name = supply.get("Name") or supply.get("Id")
            ok = 1.0 if state == "Enabled" and health == "OK" else 0.0
            points.append(self._point(source, device, "psu_ok", ok, sensor=name, item=supply))
            metrics = _link(supply, "Metrics")
            if metrics:
                values = client.get(metrics)
                for redfish_name, metric in (
                    ("InputPowerWatts", "psu_input_watts"),
                    ("OutputPowerWatts", "psu_output_watts"),
                ):
                    value = _reading(values.get(redfish_name))
                    if value is not None:
                        points.append(self._point(source, device, metric, value, sensor=name, item=supply))
        return points

    def _thermal(self, thermal: dict, source: RedfishSource, device: str) -> list[dict]:
        points = []
        for item in thermal.get("Temperatures", []):
            value = _reading(item.get("ReadingCelsius"))
            if value is None or _status(item)[0] == "Absent":
                continue
            points.append(
                self._point(
                    source, device, _temperature_metric(item), value, sensor=item.get("Name"), item=item
                )
            )
        for item in thermal.get("Fans", []):
            if _status(item)[0] == "Absent":
                continue
            units = item.get("ReadingUnits", "RPM")
            value = _reading(item.get("Reading"))
            if value is None:  # Thermal.v1_0 fans
                value, units = _reading(item.get("ReadingRPM")), "RPM"
            if value is None:
                continue
            metric = "fan_speed_percent" if units == "Percent" else "fan_speed_rpm"
            points.append(
                self._point(
                    source, device, metric, value, sensor=item.get("Name") or item.get("FanName"), item=item
                )
            )
        return points

    def _power(self, power: dict, source: RedfishSource, device: str) -> list[dict]:
        points = []
        for item in power.get("PowerControl", []):
            value = _reading(item.get("PowerConsumedWatts"))
            if value is not None:
                points.append(
                    self._point(source, device, "power_draw_watts", value, sensor=item.get("Name"), item=item)
                )
        for item in power.get("PowerSupplies", []):
            state, health = _status(item)
            name = item.get("Name") or item.get("MemberId")
            if state == "Absent":
                continue
            ok = 1.0 if state == "Enabled" and health == "OK" else 0.0
            points.append(self._point(source, device, "psu_ok", ok, sensor=name, item=item))
            value = _reading(item.get("PowerInputWatts"))
            if value is not None:
                points.append(self._point(source, device, "psu_input_watts", value, sensor=name, item=item))
            value = _reading(item.get("LastPowerOutputWatts", item.get("PowerOutputWatts")))
            if value is not None:
                points.append(self._point(source, device, "psu_output_watts", value, sensor=name, item=item))
        return points

    # --- CDU: coolant connectors -----------------------------------------------------------------------------

    def _cdu(self, client: _Client, source: RedfishSource) -> list[dict]:
        if not source.path:
            raise RedfishError(f"{source.url}: a CDU source needs the CoolingUnit's path")
        unit = client.get(source.path)
        device = unit.get("@odata.id", source.path)
        points = []
        for loop, key in (
            ("primary", "PrimaryCoolantConnectors"),
            ("secondary", "SecondaryCoolantConnectors"),
        ):
            link = (unit.get(key) or {}).get("@odata.id")
            if not link:
                continue
            for member in client.get(link).get("Members", []):
                connector = client.get(member["@odata.id"])
                sensor = f"{loop}/{connector.get('Id') or connector.get('Name')}"
                for redfish_name, metric, scale in (
                    ("SupplyPressurekPa", "cdu_supply_pressure_pascals", 1000.0),
                    ("ReturnPressurekPa", "cdu_return_pressure_pascals", 1000.0),
                    ("DeltaPressurekPa", "cdu_differential_pressure_pascals", 1000.0),
                    ("FlowLitersPerMinute", "cdu_flow_cubic_meters_per_second", 1 / 60000.0),
                    ("SupplyTemperatureCelsius", "cdu_supply_temperature_celsius", 1.0),
                    ("ReturnTemperatureCelsius", "cdu_return_temperature_celsius", 1.0),
                ):
                    value = _reading(connector.get(redfish_name))
                    if value is not None:
                        points.append(
                            self._point(source, device, metric, value * scale, sensor=sensor, item=connector)
                        )
        return points

    # --- rack PDU: mains circuits and metrics ------------------------------------------------------------------

    def _pdu(self, client: _Client, source: RedfishSource) -> list[dict]:
        if not source.path:
            raise RedfishError(f"{source.url}: a PDU source needs the PowerDistribution's path")
        pdu = client.get(source.path)
        device = pdu.get("@odata.id", source.path)
        points = []
        mains = (pdu.get("Mains") or {}).get("@odata.id")
        for member in client.get(mains).get("Members", []) if mains else []:
            circuit = client.get(member["@odata.id"])
            name = circuit.get("Id") or circuit.get("Name")
            value = _reading(circuit.get("CurrentAmps"))
            if value is not None:
                points.append(
                    self._point(source, device, "pdu_current_amperes", value, sensor=name, item=circuit)
                )
            for line, excerpt in sorted((circuit.get("PolyPhaseCurrentAmps") or {}).items()):
                value = _reading(excerpt)
                if value is not None:
                    points.append(
                        self._point(
                            source,
                            device,
                            "pdu_current_amperes",
                            value,
                            sensor=f"{name}/{line}",
                            item=circuit,
                        )
                    )
            value = _reading(circuit.get("Voltage"))
            if value is not None:
                points.append(
                    self._point(source, device, "pdu_voltage_volts", value, sensor=name, item=circuit)
                )
            value = _reading(circuit.get("PowerWatts"))
            if value is not None:
                points.append(
                    self._point(source, device, "pdu_power_watts", value, sensor=name, item=circuit)
                )
        metrics = (pdu.get("Metrics") or {}).get("@odata.id")
        if metrics:
            value = _reading(client.get(metrics).get("PowerWatts"))
            if value is not None:
                points.append(self._point(source, device, "pdu_power_watts", value, sensor="total"))
        return points


def _temperature_metric(item: dict) -> str:
    context = (item.get("PhysicalContext") or "").lower()
    name = (item.get("Name") or "").lower()
    if context == "intake" or "inlet" in name or "intake" in name or "ambient" in name:
        return "inlet_temperature_celsius"
    if context == "exhaust" or "exhaust" in name or "outlet" in name:
        return "exhaust_temperature_celsius"
    return "temperature_celsius"
