"""Running the demo world: simulated node agents post telemetry through the ingest API, and interruptions
drawn from the fault model arrive the way real ones do.

- GPU, ECC, thermal and NIC faults show up in the agents' telemetry (an Xid event, a double-bit ECC count
  that rises, a temperature over the limit, a link that goes down), some of them after precursors the
  predictor can find (temperature creep, corrected ECC rising, NIC symbol errors, a rack's cooling loop
  losing pressure and warming all its GPUs).
- A node that dies stops reporting; Prometheus would fire a NodeDown alert: the simulator posts it to the
  Alertmanager webhook.
- A software crash is reported by the job's launcher through the faults API.
- A dead node whose escalation ladder waits for a repair is repaired by the simulated data-centre technician
  after REPAIR_HOURS of simulated time (``POST /api/v1/faults/{id}/repaired/``); once Lockstep counts it repaired,
  it comes back to life and reports again, so its health check and clean-telemetry window run on fresh evidence
  and a returned spare keeps reporting.

Everything goes over HTTP with the simulator's own agent and operator tokens, so the control plane cannot
tell it from a real fleet. When the control plane is away the runner keeps its state and tries again.
"""

import logging
import math
import random
import time
import uuid
from dataclasses import dataclass, field

import requests

from fleet.models import Node
from simulator.models import SimWorld
from simulator.profiles import MANIFESTATIONS, PROFILES
from simulator.sampling import FaultSampler, Strike

log = logging.getLogger(__name__)

PRECURSOR_SECONDS = 180.0  # real seconds of warning before a predicted strike (after time compression)
GREY_SECONDS = 600.0  # how long a grey fabric failure (errors rising, link up) lasts
GREY_PER_HOUR = 4.0  # grey fabric failures per real hour across the demo fleet
GREY_SLOWDOWN = 0.30  # a degraded link slows every collective of a job that crosses it
THROTTLE_SLOWDOWN = 0.15  # a GPU hot enough to throttle slows its whole (lock-step) job
NIC_REPAIR_SECONDS = 300.0  # a downed link comes back after this long (the cable is reseated)
REPAIR_HOURS = 4.0  # simulated hours a technician takes to repair a dead node (reboot, reseat, swap a part)
# The live demo's staged first fault (``showcase_after``): a rail NIC under the largest protected job goes down, as
# Llama 3's "Network Switch/Cable" cause does, so a new visitor sees protection work in the first minutes.
SHOWCASE_COMPONENT = "Network Switch/Cable"
SHOWCASE_NIC_INDEX = 3
REVIVED_STAGES = ("repaired", "validated", "returned")  # the ladder counts the node repaired: it runs again


@dataclass
class GPUSim:
    temperature: float
    sbe: int = 0
    dbe: int = 0
    warming: float = 0.0  # °C added by a precursor or a facility fault


@dataclass
class NICSim:
    link_downed: int = 0
    symbol_error: int = 0
    down_until: float = 0.0
    noisy: float = 0.0  # symbol errors per tick while a precursor or a grey failure runs
    xmit_wait: int = 0
    congested: float = 0.0  # extra port_xmit_wait ticks per reading while its rail is congested


@dataclass
class NodeSim:
    id: int
    hostname: str
    rack: str
    cluster: str
    leaf: str
    gpus: list[GPUSim]
    nics: dict[str, NICSim]
    dead: bool = False
    repair_due: float | None = None  # monotonic time the technician's repair of a dead node is done


@dataclass
class Pending:
    strike: Strike
    node: NodeSim
    gpu_index: int
    due: float


@dataclass
class RunnerStats:
    ticks: int = 0
    batches_sent: int = 0
    batches_failed: int = 0
    strikes: list[dict] = field(default_factory=list)


class Runner:
    def __init__(
        self,
        *,
        url: str,
        profile: str = "llama3",
        acceleration: float = 600.0,
        seed: int | None = None,
        tick_seconds: float = 10.0,
        showcase_after: float | None = None,
    ):
        self.url = url.rstrip("/")
        self.world = SimWorld.objects.get()
        self.profile = PROFILES[profile]
        self.acceleration = acceleration
        self.tick_seconds = tick_seconds
        self.random = random.Random(self.world.seed if seed is None else seed)
        self.session = requests.Session()
        self.nodes: list[NodeSim] = []
        self.racks: dict[tuple[str, str], float] = {}  # (cluster, rack) -> loop pressure (Pa)
        for node in Node.objects.select_related("cluster").order_by("cluster__name", "hostname"):
            gpus = [GPUSim(temperature=self.random.uniform(48, 62)) for _ in range(node.gpus.count())]
            nics = {name: NICSim() for name in node.nics.values_list("name", flat=True)}
            self.nodes.append(
                NodeSim(node.id, node.hostname, node.rack, node.cluster.name, node.leaf_switch, gpus, nics)
            )
            self.racks.setdefault((node.cluster.name, node.rack), 180_000.0)
        self.gpu_count = sum(len(n.gpus) for n in self.nodes)
        self.sampler = FaultSampler(self.profile, self.gpu_count, self.random.randrange(2**31))
        self.started = time.monotonic()
        self.grey: list[tuple[str, list, float]] = []  # grey failures: (kind, what they touch, until)
        self.pending: list[Pending] = []
        self.stats = RunnerStats()
        self.jobs: dict[int, dict] = {}  # the training loops this simulator runs: job id -> its own progress
        # When the staged showcase fault is due (monotonic); None: none is staged (or it has struck).
        self.showcase_due = None if showcase_after is None else self.started + showcase_after

    # --- the fault model -----------------------------------------------------------------------------------
    def _locate(self, gpu: int) -> tuple[NodeSim, int]:
        for node in self.nodes:
            if gpu < len(node.gpus):
                return node, gpu
            gpu -= len(node.gpus)
        raise IndexError(gpu)

    def schedule_due_strikes(self, now: float) -> None:
        simulated_hours = (now - self.started) * self.acceleration / 3600.0
        for strike in self.sampler.until(simulated_hours):
            node, index = self._locate(strike.gpu)
            lead = PRECURSOR_SECONDS if strike.precursor else 0.0
            self.pending.append(Pending(strike, node, index, now + lead))

    def stage_showcase(self, now: float) -> bool:
        """Stage the live demo's first fault once it is due: one rail NIC of a node under the largest running job
        that Lockstep reports protected goes down (the sampler's "Network Switch/Cable" manifestation). Only the
        fault is staged; what Lockstep decides, the failover and the GPU-hours it books are its own. While no
        protected job runs (or Lockstep cannot say), it tries again next tick. Returns whether it staged it."""
        if self.showcase_due is None or now < self.showcase_due:
            return False
        running = [job for job in self._running_jobs() or [] if job.get("protected") and job["allocations"]]
        if not running:
            return False
        job = max(running, key=lambda j: (j["gpus"], -j["id"]))
        node = self._node(sorted(a["hostname"] for a in job["allocations"])[0])
        manifestation = MANIFESTATIONS[SHOWCASE_COMPONENT]
        strike = Strike(
            at_hours=(now - self.started) * self.acceleration / 3600.0,
            component=f"{SHOWCASE_COMPONENT} (staged showcase)",
            kind=manifestation.kind,
            xid=None,
            precursor="",
            channel=manifestation.channel,
            gpu=SHOWCASE_NIC_INDEX,
        )
        self.pending.append(Pending(strike, node, SHOWCASE_NIC_INDEX, now))
        self.showcase_due = None
        return True

    def start_grey(self, kind: str, node: "NodeSim", *, index: int = 0, until: float = float("inf")) -> None:
        """Start a grey failure that slows the jobs crossing it without ever taking a link down:
        ``errors`` (symbol errors climb on one port), ``congestion`` (one rail congested across the node's leaf
        switch: port_xmit_wait climbs) or ``slow_gpu`` (one GPU runs hot and throttles)."""
        if kind == "errors":
            nic = list(node.nics.values())[index % len(node.nics)]
            nic.noisy = 500.0
            touched = [nic]
        elif kind == "congestion":
            name = f"mlx5_{index % 8}"
            touched = [
                n.nics[name]
                for n in self.nodes
                if n.cluster == node.cluster and n.leaf == node.leaf and name in n.nics
            ]
            for nic in touched:
                nic.congested = 200_000.0
        elif kind == "slow_gpu":
            gpu = node.gpus[index % len(node.gpus)]
            gpu.warming = max(gpu.warming, 28.0)
            touched = [gpu]
        else:
            raise ValueError(kind)
        self.grey.append((kind, touched, until))

    def _grey_failures(self, now: float) -> None:
        """End grey failures whose time is up; start new ones at GREY_PER_HOUR across the fleet."""
        still = []
        for kind, touched, until in self.grey:
            if until > now:
                still.append((kind, touched, until))
                continue
            for thing in touched:
                if kind == "errors":
                    thing.noisy = 0.0
                elif kind == "congestion":
                    thing.congested = 0.0
                else:
                    thing.warming = 0.0
        self.grey = still
        if self.random.random() < GREY_PER_HOUR * self.tick_seconds / 3600.0:
            node = self.random.choice([n for n in self.nodes if not n.dead])
            kind = self.random.choice(["errors", "congestion", "slow_gpu"])
            self.start_grey(kind, node, index=self.random.randrange(8), until=now + GREY_SECONDS)

    def _precursors(self, now: float) -> None:
        for item in self.pending:
            if not item.strike.precursor or now >= item.due:
                continue
            progress = 1.0 - (item.due - now) / PRECURSOR_SECONDS
            kind = item.strike.precursor
            if kind == "thermal":
                item.node.gpus[item.gpu_index].warming = 25.0 * progress
            elif kind == "ecc":
                item.node.gpus[item.gpu_index].sbe += self.random.randint(5, 40)
            elif kind == "nic":
                nic = list(item.node.nics.values())[item.gpu_index % max(1, len(item.node.nics))]
                nic.noisy = 2000.0 * progress
            elif kind == "facility":
                rack = (item.node.cluster, item.node.rack)
                self.racks[rack] = 180_000.0 * (1.0 - 0.35 * progress)
                for node in self.nodes:
                    if (node.cluster, node.rack) == rack:
                        for gpu in node.gpus:
                            gpu.warming = 12.0 * progress

    def _strike(self, item: Pending, events: dict) -> None:
        strike, node, index = item.strike, item.node, item.gpu_index
        record = {
            "component": strike.component,
            "kind": strike.kind,
            "node": node.hostname,
            "gpu": index,
            "precursor": strike.precursor,
            "channel": strike.channel,
        }
        self.stats.strikes.append(record)
        if strike.channel == "alertmanager":
            node.dead = True
            self._post_alert(node)
        elif strike.channel == "job":
            self._post_fault(node, "software_crash", details={"component": strike.component})
        elif strike.kind == "gpu_xid":
            events.setdefault(node.cluster, []).append(
                {"ts": time.time(), "node": node.hostname, "type": "xid", "xid": strike.xid, "gpu": index}
            )
        elif strike.kind == "ecc_uncorrectable":
            node.gpus[index].dbe += 1
            events.setdefault(node.cluster, []).append(
                {
                    "ts": time.time(),
                    "node": node.hostname,
                    "type": "xid",
                    "xid": strike.xid or 48,
                    "gpu": index,
                }
            )
        elif strike.kind == "thermal":
            node.gpus[index].warming = 40.0
        elif strike.kind == "nic_down":
            nic = list(node.nics.values())[index % max(1, len(node.nics))]
            nic.link_downed += 1
            nic.down_until = time.monotonic() + NIC_REPAIR_SECONDS
        for gpu in node.gpus:  # precursors end with the strike
            gpu.warming = 0.0 if strike.kind != "thermal" else gpu.warming
        for nic in node.nics.values():
            nic.noisy = 0.0
        self.racks[(node.cluster, node.rack)] = 180_000.0

    def repair_dead(self, now: float) -> int:
        """The technician: repair a dead node whose ladder waits for it (failed) once REPAIR_HOURS of simulated
        time have passed, through the API; bring back to life every dead node Lockstep counts repaired. Returns
        how many nodes came back."""
        from jobs.models import NodeEscalation

        dead = {node.id: node for node in self.nodes if node.dead}
        if not dead:
            return 0
        revived = 0
        for node_id, stage, fault_id in NodeEscalation.objects.filter(node_id__in=dead).values_list(
            "node_id", "stage", "fault_id"
        ):
            node = dead[node_id]
            if stage in REVIVED_STAGES:
                node.dead, node.repair_due = False, None
                revived += 1
            elif (
                stage == "failed" and fault_id is not None and self.acceleration > 0
            ):  # time stands still at 0
                if node.repair_due is None:
                    node.repair_due = now + REPAIR_HOURS * 3600.0 / self.acceleration
                elif now >= node.repair_due and self._send(
                    f"{self.url}/api/v1/faults/{fault_id}/repaired/",
                    {"reason": f"simulated technician: {node.hostname} rebooted and reseated"},
                    self.world.api_token,
                ):
                    node.repair_due = None
        return revived

    # --- talking to the control plane ----------------------------------------------------------------------
    def _post_alert(self, node: NodeSim) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {
            "version": "4",
            "status": "firing",
            "receiver": "lockstep",
            "groupLabels": {},
            "commonLabels": {},
            "commonAnnotations": {},
            "externalURL": "http://alertmanager.simulated",
            "groupKey": node.hostname,
            "truncatedAlerts": 0,
            "alerts": [
                {
                    "status": "firing",
                    "labels": {"alertname": "NodeDown", "node": node.hostname},
                    "annotations": {"summary": f"{node.hostname} stopped answering"},
                    "startsAt": now,
                    "endsAt": "0001-01-01T00:00:00Z",
                    "fingerprint": uuid.uuid4().hex[:16],
                }
            ],
        }
        self._send(f"{self.url}/api/v1/ingest/alertmanager/", body, self.world.api_token)

    def _post_fault(self, node: NodeSim, kind: str, details: dict) -> None:
        self._send(
            f"{self.url}/api/v1/faults/",
            {"node": node.id, "kind": kind, "source": "simulator", "details": details},
            self.world.api_token,
        )

    def _send(self, url: str, body: dict, token: str) -> bool:
        try:
            response = self.session.post(
                url, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=15
            )
        except requests.RequestException as error:
            log.warning("control plane unreachable (%s); will try again", error)
            return False
        if response.status_code >= 400:
            log.warning("%s answered %s: %s", url, response.status_code, response.text[:300])
            return False
        return True

    def _gpu_readings(self, node: NodeSim, now: float) -> list[dict]:
        """One DCGM reading per GPU of ``node`` at ``now``, its corrected-ECC count moving on as it is read."""
        readings = []
        for index, gpu in enumerate(node.gpus):
            gpu.sbe += 1 if self.random.random() < 0.01 else 0
            temperature = gpu.temperature + gpu.warming + self.random.gauss(0, 0.8)
            readings.append(
                {
                    "ts": now,
                    "node": node.hostname,
                    "gpu": index,
                    "uuid": f"{node.hostname}-{index}",
                    "fields": {
                        "DCGM_FI_DEV_GPU_TEMP": round(temperature, 1),
                        "DCGM_FI_DEV_POWER_USAGE": round(self.random.uniform(580, 690), 1),
                        "DCGM_FI_DEV_GPU_UTIL": round(self.random.uniform(88, 99), 1),
                        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": gpu.sbe,
                        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": gpu.dbe,
                        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 0x20 if temperature > 85 else 0,
                    },
                }
            )
        return readings

    def _nic_readings(self, node: NodeSim, now: float, monotonic: float) -> list[dict]:
        """One reading per NIC of ``node`` at ``now``, its counters moving on as it is read; a link whose repair
        is not done by ``monotonic`` reads down."""
        nics = []
        for name, nic in node.nics.items():
            nic.symbol_error += int(nic.noisy)
            nic.xmit_wait += self.random.randint(20, 200) + int(nic.congested)
            down = nic.down_until > monotonic
            nics.append(
                {
                    "ts": now,
                    "node": node.hostname,
                    "name": name,
                    "kind": "infiniband",
                    "link_state": "down" if down else "up",
                    "fields": {
                        "link_downed": nic.link_downed,
                        "symbol_error": nic.symbol_error,
                        "link_error_recovery": 0,
                        "port_rcv_errors": 0,
                        "port_xmit_wait": nic.xmit_wait,
                    },
                }
            )
        return nics

    def _facility_readings(self, cluster: str, now: float) -> list[dict]:
        """The cooling loop's pressure and the PDU's current of every rack of ``cluster`` at ``now``."""
        facility = []
        for (name, rack), pressure in self.racks.items():
            if name == cluster:
                facility.append(
                    {
                        "ts": now,
                        "source": "simulator",
                        "scope": "rack",
                        "target": rack,
                        "device": f"cdu-{rack}",
                        "sensor": "loop",
                        "metric": "cdu_differential_pressure_pascals",
                        "value": round(pressure + self.random.gauss(0, 500), 1),
                    }
                )
                # the rack PDU draws more as the loop weakens and fans and pumps work harder
                facility.append(
                    {
                        "ts": now,
                        "source": "simulator",
                        "scope": "rack",
                        "target": rack,
                        "device": f"pdu-{rack}",
                        "sensor": "branch-a",
                        "metric": "pdu_current_amperes",
                        "value": round(
                            48.0 * (1 + (180_000.0 - pressure) / 180_000.0) + self.random.gauss(0, 0.4), 2
                        ),
                    }
                )
        return facility

    def _batch(self, cluster: str, now: float, events: list[dict]) -> dict:
        """The relay's telemetry batch for ``cluster`` at ``now``: every live node's GPU and NIC readings, the
        racks' facility readings, and ``events``."""
        readings, nics = [], []
        monotonic = time.monotonic()
        for node in self.nodes:
            if node.cluster != cluster or node.dead:
                continue
            readings.extend(self._gpu_readings(node, now))
            nics.extend(self._nic_readings(node, now, monotonic))
        facility = self._facility_readings(cluster, now)
        return {
            "schema_version": 1,
            "batch_id": str(uuid.uuid4()),
            "agent": {
                "name": "lockstep-simulator",
                "version": "1",
                "hostname": f"relay-{cluster}",
                "gpu_status": "ok",
            },
            "created_at": now,
            "sent_at": now,
            "node": None,
            "readings": readings,
            "nics": nics,
            "events": events,
            "facility": facility,
        }

    def tick(self) -> None:
        now_monotonic = time.monotonic()
        self.schedule_due_strikes(now_monotonic)
        self.stage_showcase(now_monotonic)
        self._precursors(now_monotonic)
        self._grey_failures(now_monotonic)
        events: dict[str, list] = {}
        due = [item for item in self.pending if item.due <= now_monotonic]
        self.pending = [item for item in self.pending if item.due > now_monotonic]
        for item in due:
            self._strike(item, events)
        self.repair_dead(now_monotonic)
        now = time.time()
        self.drive_jobs(now)
        for cluster, token in self.world.agent_tokens.items():
            batch = self._batch(cluster, now, events.get(cluster, []))
            if self._send(f"{self.url}/api/v1/ingest/telemetry/", batch, token):
                self.stats.batches_sent += 1
            else:
                self.stats.batches_failed += 1
                # the Xid events were not delivered: keep them for the next batch (the agent's spool does this)
                for event in events.get(cluster, []):
                    self.pending.append(
                        Pending(_replay_strike(event), self._node(event["node"]), event["gpu"], 0.0)
                    )
        self.stats.ticks += 1

    # --- the jobs' own training loops ------------------------------------------------------------------------
    def _slowdown(self, hostnames: set[str]) -> float:
        """How much slower a lock-step job runs: as slow as its slowest part (a grey link it crosses, a GPU
        that throttles)."""
        slow = 0.0
        for node in self.nodes:
            if node.hostname not in hostnames:
                continue
            if any(
                (nic.noisy > 0 or nic.congested > 0) and nic.down_until <= time.monotonic()
                for nic in node.nics.values()
            ):
                slow = max(slow, GREY_SLOWDOWN)
            if any(gpu.temperature + gpu.warming > 85 for gpu in node.gpus):
                slow = max(slow, THROTTLE_SLOWDOWN)
        return slow

    def _running_jobs(self) -> list[dict] | None:
        """The running jobs, as Lockstep lists them; None when it could not say."""
        jobs, url = [], f"{self.url}/api/v1/jobs/?state=Running&page_size=500"
        while url:
            try:
                response = self.session.get(
                    url, headers={"Authorization": f"Bearer {self.world.api_token}"}, timeout=15
                )
            except requests.RequestException:
                return None
            if response.status_code != 200:
                return None
            body = response.json()
            jobs += body["results"]
            url = body.get("next")
        return jobs

    def drive_jobs(self, now: float) -> int:
        """Advance every running job on a simulated cluster at its own step time, slowed by what its nodes
        suffer, and report iteration, step time and checkpoints through the progress API, as a training loop
        calling the agent's progress helper would. A job does not train while Lockstep recovers it: running again,
        it goes on from where Lockstep says it is (its restore point, or where it stopped), from then on."""
        reported = 0
        simulated = set(self.world.agent_tokens)
        running = self._running_jobs()
        if running is None:
            return 0
        for job in running:
            if job["cluster_name"] not in simulated:
                continue
            mine = self.jobs.get(job["id"])
            if mine is None or mine["stopped"] or job["iteration"] < mine["iteration"] - 1:
                mine = self.jobs[job["id"]] = {
                    "iteration": float(job["iteration"]),
                    "at": now,
                    "base": float(job["seconds_per_iteration"]),
                    "stopped": False,
                }
            hosts = {allocation["hostname"] for allocation in job["allocations"]}
            step = mine["base"] * (1.0 + self._slowdown(hosts))
            before = mine["iteration"]
            after = before + max(0.0, now - mine["at"]) / step
            interval = max(1, int(job["checkpoint_interval"]))
            checkpoint = int(after) // interval > int(before) // interval
            if self._send(
                f"{self.url}/api/v1/jobs/{job['id']}/progress/",
                {"iteration": int(after), "step_seconds": round(step, 4), "checkpoint": checkpoint},
                self.world.api_token,
            ):
                mine["iteration"], mine["at"] = after, now
                reported += 1
        listed = {job["id"] for job in running}
        for job_id, mine in self.jobs.items():
            mine["stopped"] = job_id not in listed
        return reported

    def _node(self, hostname: str) -> NodeSim:
        return next(n for n in self.nodes if n.hostname == hostname)

    def run(self, *, ticks: int | None = None, stop=None) -> RunnerStats:
        done = 0
        while (ticks is None or done < ticks) and not (stop and stop()):
            started = time.monotonic()
            self.tick()
            done += 1
            time.sleep(max(0.0, self.tick_seconds - (time.monotonic() - started)))
        return self.stats

    def expected_strikes_per_hour(self) -> float:
        return self.profile.rate_per_gpu_hour * self.gpu_count * self.acceleration

    def describe(self) -> str:
        mean = self.profile.mean_hours_between(self.gpu_count)
        return (
            f"{len(self.nodes)} nodes, {self.gpu_count} GPUs, profile {self.profile.name} "
            f"({self.profile.source}): one interruption every {mean:.1f} simulated hours, "
            f"{self.expected_strikes_per_hour():.1f} per real hour at {self.acceleration:g}x"
        )


def _replay_strike(event: dict) -> Strike:
    return Strike(
        at_hours=math.nan,
        component="(redelivered)",
        kind="gpu_xid",
        xid=event["xid"],
        precursor="",
        channel="agent",
        gpu=0,
    )
