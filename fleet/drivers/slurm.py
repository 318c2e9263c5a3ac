"""The Slurm driver: a cluster reached through Slurm's own command-line tools and their JSON output.

Why the CLI and not slurmrestd: every Slurm site has the client tools on its login nodes, and ``sinfo --json`` /
``squeue --json`` answer with the same data parser slurmrestd uses; slurmrestd needs its own daemon, a JWT key and
a version-specific OpenAPI plugin, which most sites do not run. The host Lockstep's workers run on acts as a
submit host: it has the cluster's ``slurm.conf`` (or reaches the controller configless) and its munge socket.

- nodes (``observe_nodes``): ``sinfo --json``: state and flags, reason, features, CPUs, GPUs from gres,
  partitions;
- cordon and drain: ``scontrol update NodeName=… State=DRAIN Reason="lockstep: …"`` naming the node's open
  Lockstep incident (through ``fleet.hooks.node_reason``); Slurm lets running jobs finish, so the node shows
  draining until Slurm reports it drained (``drain_done``); uncordon: ``State=RESUME``;
- restart from checkpoint: hold and requeue the job (``scontrol requeuehold``), exclude the bad nodes
  (``ExcNodeList``), pin it to where Lockstep placed it (``ReqNodeList``: its other nodes and the spares it
  booked), release it; a bad node Slurm reports not responding is first set DOWN (and drained again,
  so it stays out when its slurmd comes back), so the requeued job need not wait for the node's timeout to
  finish completing; the operation succeeds when Slurm runs the job again (restart count up);
- health check: a short batch job pinned to the node (``-w``) inside a maintenance reservation of the node,
  running ``health_check_command`` (default: a matrix multiply checked against its known result); the node is
  resumed for the check and drained again afterwards, whatever the result, so only Lockstep's return to
  service (an uncordon) puts it back;
- node software: ``ActiveFeatures`` of the form ``<component>_<version>`` (``driver_550`` → gpu_driver 550).

- restore from snapshot (a job whose protection runtime reports, ``jobs.protection``): the same requeue without
  the bad nodes; the runtime restores every rank from the in-memory snapshots its nodes' holders kept (the lost
  node's rank from its peer's replica), not from the disk checkpoint;
- proactive move (``relaunch_without_node``): once the job has written its snapshot through at Lockstep's
  request (``jobs.services.moves``), the same requeue without the node predicted to fail.

- rank replacement (``replace_rank``; a protected job submitted with standbys in its own allocation, ``--no-kill``):
  the lost node is drained with its incident's reason and the job is *not* requeued; the job's protection runtime
  puts a standby in the lost rank's place and reports it (``rank_replaced``), which ends the operation
  (jobs.services.rank_replacement); ``replenish_standby`` then submits a one-node standby job on the spare
  partition that joins the job as a new standby.

Not supported (declared, so the planner never offers them): add-on installs, taints, NIC failover, GPU reset,
platform snapshots.

Connection settings (``Cluster.connection``): ``slurm_conf`` (path; the ``SLURM_CONF`` the tools read),
``bin_dir`` (where the tools are, default: PATH), ``spare_partition`` (idle nodes there are Lockstep's spares),
``accounts`` (Slurm account → tenant slug), ``default_tenant`` (tenant slug for unmapped accounts; without it,
jobs of unmapped accounts are not adopted and are listed to the provider in the sync's report),
``health_check_command`` (shell, run on the node by the check job), ``requeue_at_once`` (default true),
``gpu_model`` (the GPU model Lockstep records for the cluster's nodes, default ``gpu``), ``health_check_seconds`` (its time limit,
default 60), ``timeout_seconds`` (per command, default 30), ``job_secret_key`` (32 characters or more: the
key the cluster's Slurm prolog derives each job's secret with; when set, every launcher registration must
bring the job's secret, ``jobs.launchers``).
"""

import json
import os
import re
import shlex
import subprocess
from datetime import timedelta

from django.utils import timezone

from fleet.drivers.base import ClusterDriver, DriverError, ObservedState, Operation, OperationResult
from fleet.specs import NODE_SOFTWARE_PREFIX

# A pure-Python check anywhere python3 runs: a 64×64 integer matrix squared, checked against its known sum.
DEFAULT_HEALTH_CHECK = (
    'python3 -c "n=64; a=[[(i*j)%7 for j in range(n)] for i in range(n)]; '
    "c=[[sum(a[i][k]*a[k][j] for k in range(n)) for j in range(n)] for i in range(n)]; "
    "s=sum(map(sum,c)); print('checksum', s); raise SystemExit(0 if s==1928934 else 1)\""
)
# Node features that name node software: driver_550 → gpu_driver 550.
FEATURE_COMPONENTS = {
    "driver": "gpu_driver",
    "gpu_driver": "gpu_driver",
    "cuda": "cuda",
    "nccl": "nccl",
    "nicfw": "nic_firmware",
    "nic_firmware": "nic_firmware",
}
DRAINED = "drained"
RUNNING_STATES = {"RUNNING"}
WAITING_STATES = {
    "PENDING",
    "CONFIGURING",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "RESIZING",
    "COMPLETING",
    "SUSPENDED",
    "SIGNALING",
    "STAGE_OUT",
}
GRES_GPU = re.compile(r"gpu(?::[^:(,]+)?:(\d+)")


def gpus_of(gres: str) -> int:
    """GPUs in a node's gres string (``gpu:2``, ``gpu:a100:4(S:0-1)``)."""
    return sum(int(found) for found in GRES_GPU.findall(gres or ""))


def node_condition(node: dict) -> str:
    """One word for a Slurm node: down, not_responding, drained, draining, allocated, idle."""
    state = (node.get("state") or "").lower()
    flags = {flag.upper() for flag in node.get("state_flags") or []}
    if state == "down":
        return "down"
    if "NOT_RESPONDING" in flags:
        return "not_responding"
    if "DRAIN" in flags:
        return "draining" if state in ("mixed", "allocated") or "COMPLETING" in flags else DRAINED
    return "allocated" if state in ("mixed", "allocated") else state or "unknown"


class SlurmDriver(ClusterDriver):
    name = "slurm"
    supports = frozenset(
        {
            Operation.OBSERVE_ADDONS,
            Operation.CORDON,
            Operation.UNCORDON,
            Operation.DRAIN,
            Operation.RESTART_FROM_CHECKPOINT,
            Operation.RESTORE_FROM_SNAPSHOT,
            Operation.RELAUNCH_WITHOUT_NODE,
            Operation.HEALTH_CHECK,
        }
    )

    @property
    def connection(self) -> dict:
        return self.cluster.connection or {}

    # --- the tools --------------------------------------------------------------------------------------------
    def _run(self, *args: str) -> str:
        binary = (
            os.path.join(self.connection["bin_dir"], args[0]) if self.connection.get("bin_dir") else args[0]
        )
        env = dict(os.environ)
        if self.connection.get("slurm_conf"):
            if not os.path.exists(str(self.connection["slurm_conf"])):
                raise DriverError(
                    f"cluster {self.cluster.name}: no slurm.conf at {self.connection['slurm_conf']}"
                )
            env["SLURM_CONF"] = str(self.connection["slurm_conf"])
        try:
            done = subprocess.run(
                [binary, *args[1:]],
                capture_output=True,
                text=True,
                env=env,
                check=False,
                timeout=float(self.connection.get("timeout_seconds", 30)),
            )
        except FileNotFoundError as error:
            raise DriverError(f"{args[0]} is not installed on this host") from error
        except subprocess.TimeoutExpired as error:
            raise DriverError(f"{args[0]} timed out", transient=True) from error
        if done.returncode != 0:
            message = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["failed"]
            transient = any(
                s in done.stderr.lower()
                for s in (
                    "unable to contact",
                    "connection refused",
                    "timed out",
                    "socket timed out",
                    "communication",
                )
            )
            raise DriverError(f"{' '.join(args[:2])}: {message[0]}", transient=transient)
        return done.stdout

    def _json(self, *args: str) -> dict:
        try:
            return json.loads(self._run(*args) or "{}")
        except json.JSONDecodeError as error:
            raise DriverError(f"{args[0]} answered no JSON: {error}") from error

    def nodes(self) -> list[dict]:
        return self._json("sinfo", "--json").get("nodes", [])

    def node(self, hostname: str) -> dict | None:
        return next((n for n in self.nodes() if n.get("name") == hostname), None)

    def jobs(self) -> list[dict]:
        return self._json("squeue", "--json", "--all").get("jobs", [])

    def job(self, slurm_job_id) -> dict | None:
        """The job as squeue shows it; None when squeue knows no such job, including an id it refuses as
        invalid (an id past the ones this Slurm hands out: fuzzed ids near 2^32 were answered 503 otherwise)."""
        try:
            found = self._json("squeue", "--json", "--all", "--jobs", str(slurm_job_id)).get("jobs", [])
        except DriverError as error:
            if "invalid job id" in str(error).lower():
                return None
            raise
        return next((j for j in found if str(j.get("job_id")) == str(slurm_job_id)), None)

    def _reason(self, node, fallback: str) -> str:
        from fleet import hooks

        reason = hooks.node_reason(node) or fallback
        return ("lockstep: " + reason)[:200].replace('"', "'")

    # --- nodes ------------------------------------------------------------------------------------------------
    def cordon(self, node) -> OperationResult:
        self._run(
            "scontrol",
            "update",
            f"NodeName={node.hostname}",
            "State=DRAIN",
            f"Reason={self._reason(node, 'cordoned')}",
        )
        return OperationResult(handle=f"node:{node.hostname}", detail="drain (no new jobs)")

    def drain(self, node) -> OperationResult:
        self._run(
            "scontrol",
            "update",
            f"NodeName={node.hostname}",
            "State=DRAIN",
            f"Reason={self._reason(node, 'drained')}",
        )
        return OperationResult(handle=f"drain:{node.hostname}", detail="drain: running jobs finish")

    def drain_done(self, node) -> bool:
        found = self.node(node.hostname)
        return found is None or node_condition(found) in (DRAINED, "down")

    def uncordon(self, node) -> OperationResult:
        found = self.node(node.hostname)
        flags = {flag.upper() for flag in (found or {}).get("state_flags") or []}
        if found is not None and ("DRAIN" in flags or (found.get("state") or "").lower() == "down"):
            self._run("scontrol", "update", f"NodeName={node.hostname}", "State=RESUME")
        return OperationResult(handle=f"node:{node.hostname}", detail="resumed")

    # --- restart from checkpoint --------------------------------------------------------------------------------
    def slurm_job_id(self, job_ref: str) -> str:
        """The Slurm job id of a Lockstep job (``job-<pk>``), from its link (jobs registers the resolver)."""
        from fleet import hooks

        found = hooks.slurm_job_of(job_ref)
        if not found:
            raise DriverError(f"{job_ref} is not a Slurm job of cluster {self.cluster.name}")
        return str(found)

    def restart_from_checkpoint(self, job_ref: str, exclude=(), nodes=()) -> OperationResult:
        """Requeue the job without the ``exclude`` nodes (on exactly ``nodes`` when given); it resumes from its own
        newest checkpoint."""
        slurm_id = self.slurm_job_id(job_ref)
        current = self.job(slurm_id)
        if current is None:
            raise DriverError(f"Slurm no longer knows job {slurm_id}")
        excluded = sorted(set(exclude))
        if excluded:
            by_name = {n.get("name"): n for n in self.nodes()}
            for hostname in excluded:
                found = by_name.get(hostname)
                if found is not None and node_condition(found) == "not_responding":
                    # Dead: DOWN ends the job's steps there at once; DRAIN keeps it out when its slurmd returns.
                    reason = (found.get("reason") or "lockstep: node not responding")[:200].replace('"', "'")
                    self._run("scontrol", "update", f"NodeName={hostname}", "State=DOWN", f"Reason={reason}")
                    self._run("scontrol", "update", f"NodeName={hostname}", "State=DRAIN", f"Reason={reason}")
        requeued_at = int(timezone.now().timestamp())
        try:
            self._run("scontrol", "requeuehold", slurm_id)
        except DriverError as error:
            if "pending" not in str(error).lower():
                raise
            # Slurm requeued it already (a node set DOWN under a --requeue job): hold it while it is steered.
            self._run("scontrol", "hold", slurm_id)
        if excluded:
            self._run("scontrol", "update", f"JobId={slurm_id}", f"ExcNodeList={','.join(excluded)}")
        placed = [host for host in dict.fromkeys(nodes) if host not in excluded]
        if placed:
            # Lockstep's placement: the job's surviving nodes (their snapshot holders keep its memory) and the
            # spares it booked, so that a restart beside it cannot take them first.
            self._run("scontrol", "update", f"JobId={slurm_id}", f"ReqNodeList={','.join(placed)}")
        self._run("scontrol", "release", slurm_id)
        restarts = int((self.job(slurm_id) or current).get("restart_cnt") or 0)
        handle = f"requeue:{slurm_id}:{restarts}:{requeued_at}:{','.join(excluded)}"
        if len(handle) > 100:  # the stored handle's length: the start-time check alone still holds
            handle = f"requeue:{slurm_id}:{restarts}:{requeued_at}:"
        return OperationResult(
            handle=handle,
            done_at=timezone.now(),
            detail=f"requeued Slurm job {slurm_id} excluding {', '.join(excluded) or 'no node'}",
        )

    def restore_from_snapshot(self, job_ref: str, snapshot_ref: str, exclude=(), nodes=()) -> OperationResult:
        """Requeue the job without the ``exclude`` nodes, as for a restart; its protection runtime then restores
        every rank from the in-memory snapshots that survive on the nodes' snapshot holders (a lost node's rank
        from its peer's replica) instead of the disk checkpoint. ``snapshot_ref`` is unused: the runtime picks the
        newest restore point every rank still has."""
        result = self.restart_from_checkpoint(job_ref, exclude=exclude, nodes=nodes)
        return OperationResult(
            handle=result.handle, done_at=result.done_at, detail=f"{result.detail}; restoring from memory"
        )

    def relaunch_without_node(self, job_ref: str, exclude=(), nodes=()) -> OperationResult:
        """A proactive move: requeue the running job without the ``exclude`` nodes (predicted to fail, still
        up); it restores from the snapshot it wrote through just before."""
        result = self.restart_from_checkpoint(job_ref, exclude=exclude, nodes=nodes)
        return OperationResult(
            handle=result.handle, done_at=result.done_at, detail=f"{result.detail}; moving off in time"
        )

    # --- rank replacement ---------------------------------------------------------------------------------------
    def replace_rank(self, job_ref: str, node) -> OperationResult:
        """The job's runtime replaces the rank it lost on ``node`` with one of its standbys: take the node out of
        service with its incident's reason (drained, so no job is placed there once its slurmd returns) and leave
        the job running: no requeue. The operation ends with the runtime's ``rank_replaced`` report."""
        slurm_id = self.slurm_job_id(job_ref)
        reason = self._reason(node, "node lost, its rank replaced by a standby")
        self._run("scontrol", "update", f"NodeName={node.hostname}", "State=DRAIN", f"Reason={reason}")
        return OperationResult(
            handle=f"replace:{slurm_id}:{node.hostname}"[:100],
            done_at=timezone.now(),
            detail=f"drained {node.hostname}; Slurm job {slurm_id} keeps running while a standby takes its rank",
        )

    def replenish_standby(self, job_ref: str, node=None) -> OperationResult:
        """Start a new standby for the job on an idle node of the spare partition (``node`` to pin one): a one-node
        job of the job's account running the job's own batch script with ``--standby-for <job id>``, commented
        ``lockstep-standby-for=<job id>`` (the cluster's prolog gives it the job's secret), that joins the job's
        rendezvous as a standby. Mirrors ``jobs.local_slurm.training.submit_standby(slurm, slurm_job_id, node)``
        (the test Slurm's mechanism, issue 49)."""
        slurm_id = self.slurm_job_id(job_ref)
        current = self.job(slurm_id)
        if current is None:
            raise DriverError(f"Slurm no longer knows job {slurm_id}")
        partition = self.connection.get("spare_partition") or ""
        command = current.get("command") or ""
        if not partition or not command:
            raise DriverError("no spare partition or no batch script to start a standby with")
        args = ["sbatch", "--parsable", "-p", partition, "-N", "1", "--ntasks-per-node=1"]
        if current.get("account"):
            args += ["-A", str(current["account"])]
        if current.get("current_working_directory"):
            args += ["--chdir", str(current["current_working_directory"])]
        if current.get("standard_output"):
            # Beside the job's own output: standby-<its id>.out.
            args += ["-o", os.path.join(os.path.dirname(str(current["standard_output"])), "standby-%j.out")]
        args += [f"--comment=lockstep-standby-for={slurm_id}", "-J", f"standby-{slurm_id}"]
        if node is not None:
            args += ["-w", node.hostname]
        answer = self._run(*args, *shlex.split(command), "--standby-for", slurm_id)
        standby_id = answer.strip().split(";")[0]
        return OperationResult(
            handle=f"standby:{standby_id}:{slurm_id}",
            done_at=timezone.now(),
            detail=f"standby job {standby_id} for Slurm job {slurm_id} on the {partition} partition",
        )

    # --- health check -------------------------------------------------------------------------------------------
    def health_check(self, node) -> OperationResult:
        """Resume the node inside a maintenance reservation of its own and run the check job pinned to it."""
        hostname = node.hostname
        reservation = f"lockstep-check-{hostname}"
        seconds = int(self.connection.get("health_check_seconds", 60))
        self._drop_reservation(reservation)
        self._run(
            "scontrol",
            "create",
            "reservation",
            f"ReservationName={reservation}",
            f"Nodes={hostname}",
            "StartTime=now",
            f"Duration={max(2, seconds // 60 + 2)}",
            "Users=root",
            "Flags=MAINT,IGNORE_JOBS",
        )
        self.uncordon(node)
        command = self.connection.get("health_check_command") or DEFAULT_HEALTH_CHECK
        answer = self._run(
            "sbatch",
            "--parsable",
            f"--reservation={reservation}",
            "-w",
            hostname,
            "-N",
            "1",
            "-J",
            reservation,
            f"--time={max(1, seconds // 60 + 1)}",
            "--no-requeue",
            "-o",
            "/dev/null",
            "--wrap",
            command,
        )
        slurm_id = answer.strip().split(";")[0]
        return OperationResult(
            handle=f"check:{slurm_id}:{hostname}",
            done_at=timezone.now() + timedelta(seconds=1),
            detail=f"check job {slurm_id} on {hostname}: {shlex.split(command)[0]}",
        )

    def _drop_reservation(self, name: str) -> None:
        try:
            self._run("scontrol", "delete", f"ReservationName={name}")
        except DriverError:
            pass  # none there

    def _check_status(self, slurm_id: str, hostname: str) -> str:
        found = self.job(slurm_id)
        state = (found or {}).get("job_state", "")
        if state in RUNNING_STATES or state in WAITING_STATES:
            return "running"
        passed = state == "COMPLETED" and int((found or {}).get("exit_code", 1) or 0) == 0
        # Whatever the result, the node is out again until Lockstep returns it to service.
        reason = (
            "lockstep: health check passed, awaiting return to service"
            if passed
            else f"lockstep: health check job {slurm_id} {state.lower() or 'vanished'}"
        )
        node = self.node(hostname)
        if node is not None and "DRAIN" not in {f.upper() for f in node.get("state_flags") or []}:
            self._run("scontrol", "update", f"NodeName={hostname}", "State=DRAIN", f"Reason={reason}")
        self._drop_reservation(f"lockstep-check-{hostname}")
        return "succeeded" if passed else "failed"

    def _requeue_status(self, slurm_id: str, restarts: int, since: int, excluded: set[str]) -> str:
        """Succeeded once Slurm runs the job again: restarted, started after the requeue, on none of the excluded
        nodes."""
        found = self.job(slurm_id)
        if found is None:
            return "failed"
        state = found.get("job_state", "")
        hosts = {
            entry.get("nodename") for entry in (found.get("job_resources") or {}).get("allocated_nodes") or []
        }
        if (
            state in RUNNING_STATES
            and int(found.get("restart_cnt") or 0) >= restarts
            and int(found.get("start_time") or 0) >= since
            and not hosts & excluded
        ):
            return "succeeded"
        if (
            state == "PENDING"
            and found.get("state_reason") == "BeginTime"
            and self.connection.get("requeue_at_once", True)
        ):
            # Once its old run has completed, Slurm holds a requeued job back until the old run's credentials
            # expire (AuthInfo cred_expire, 120 s by default); its steps are gone, so it may start now.
            try:
                self._run("scontrol", "update", f"JobId={slurm_id}", "StartTime=now")
            except DriverError:
                pass
        if state in WAITING_STATES or state in RUNNING_STATES:
            return "running"
        return "failed"

    def operation_status(self, handle: str) -> str:
        kind, _, rest = handle.partition(":")
        if kind == "requeue":
            slurm_id, restarts, since, excluded = (rest.split(":") + ["", "", ""])[:4]
            return self._requeue_status(
                slurm_id, int(restarts or 1), int(since or 0), {host for host in excluded.split(",") if host}
            )
        if kind == "check":
            slurm_id, _, hostname = rest.partition(":")
            return self._check_status(slurm_id, hostname)
        if kind == "replace":
            return (
                "running"  # the job's runtime reports the standby in place (jobs.services.rank_replacement)
            )
        if kind == "write-through":
            return "running"  # Lockstep waits for the job's write-through, then relaunches it (jobs.services.moves)
        if kind == "drain":
            found = self.node(rest)
            return "succeeded" if found is None or node_condition(found) in (DRAINED, "down") else "running"
        return "succeeded"

    # --- node software ------------------------------------------------------------------------------------------
    def observe_addons(self) -> list[ObservedState]:
        """Node software from node features: a component's version when every node carries the same one."""
        from fleet.choices import HealthStatus

        seen: dict[str, set[str]] = {}
        for node in self.nodes():
            features = node.get("active_features") or node.get("features") or ""
            for feature in features.split(","):
                key, _, version = feature.strip().rpartition("_")
                if key in FEATURE_COMPONENTS and version:
                    seen.setdefault(FEATURE_COMPONENTS[key], set()).add(version)
        out = []
        for component, versions in sorted(seen.items()):
            single = len(versions) == 1
            out.append(
                ObservedState(
                    name=NODE_SOFTWARE_PREFIX + component,
                    version=versions.pop() if single else "mixed",
                    health=HealthStatus.HEALTHY if single else HealthStatus.PROGRESSING,
                )
            )
        return out
