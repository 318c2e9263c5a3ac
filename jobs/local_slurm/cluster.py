"""A real Slurm for tests and the demo: its own ``munged``, one ``slurmctld`` and several ``slurmd`` on one host,
each emulating a node (``slurmd -N n1``), in a folder of its own with a generated ``slurm.conf`` on free ports.

    with SlurmCluster(tmp_path, nodes=3, spare_nodes=1) as slurm:
        slurm.run("sinfo")                      # the CLI tools, pointed at this cluster (SLURM_CONF)
        slurm.kill_node("n2")                   # slurmd and the job steps and ranks on n2 end

With ``holders=True`` each node also runs its protection-runtime snapshot holder (``lockstep_agent.snapshot_holder``,
a node daemon like slurmd, outside every job) at ``holder_socket(name)``; killing the node kills it too.

With ``job_secrets=True`` (the default) jobs prove who they are as a provider sets it up (``lockstep_agent.launcher``):
a root-only key file, a root ``Prolog`` that derives each job's secret into a file only the job's user reads,
a ``TaskProlog`` that exports it to the job's tasks as ``LOCKSTEP_JOB_SECRET`` and an ``Epilog`` that removes it;
``connection()`` carries the same key (``job_secret_key``), so Lockstep asks every registration for the secret.

Every daemon runs in a session of its own and is stopped (its process group killed) when the context ends.
Needs ``slurmctld``, ``slurmd``, ``munged`` and the CLI tools (Debian: ``slurm-wlm``, ``munge``) and root (the
daemons run as SlurmUser=root); ``available()`` says whether they are there.
"""

import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "scancel")


def available() -> str:
    """Why a real Slurm cannot start here ('' when it can)."""
    missing = [
        name for name in BINARIES if shutil.which(name) is None and not Path(f"/usr/sbin/{name}").exists()
    ]
    if missing:
        return f"Slurm is not installed (missing {', '.join(missing)}; apt-get install slurm-wlm munge)"
    if os.geteuid() != 0:
        return "the test Slurm runs its daemons as root"
    return ""


def _binary(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def _free_ports(count: int) -> list[int]:
    """``count`` free ports: consecutive for the node daemons (slurm.conf's ``Port=a-b`` takes a range)."""
    for _ in range(200):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65000:
            continue
        held = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind(("127.0.0.1", port))
                held.append(sock)
            return list(range(base, base + count))
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError("no run of free ports found")


class SlurmCluster:
    """One Slurm cluster of ``nodes`` emulated nodes ``n1``…; the last ``spare_nodes`` of them also form the
    partition ``spare`` (and weigh more, so Slurm places jobs on the others first). Each node declares
    ``gpus`` GPUs as a generic resource (device files are plain files in the folder) and the feature
    ``features`` (node software, e.g. ``driver_550``)."""

    def __init__(
        self,
        folder: Path,
        *,
        nodes: int = 3,
        spare_nodes: int = 1,
        cpus: int = 2,
        gpus: int = 2,
        features: str = "driver_550",
        slurmd_timeout: int = 10,
        cred_expire: int = 10,
        name: str = "lockstep",
        holders: bool = False,
        job_secrets: bool = True,
    ):
        self.folder = Path(folder)
        self.names = [f"n{i}" for i in range(1, nodes + 1)]
        self.spares = self.names[len(self.names) - spare_nodes :] if spare_nodes else []
        self.cpus, self.gpus, self.features = cpus, gpus, features
        self.slurmd_timeout = slurmd_timeout
        # Slurm's default is 120 s; a requeued job waits this long before it may start again.
        self.cred_expire = cred_expire
        self.cluster_name = name
        self.processes: dict[str, subprocess.Popen] = {}
        self.conf = self.folder / "slurm.conf"
        # munged wants every folder above its socket open to all (pytest's tmp_path is not), and socket paths
        # are short: the socket gets a folder of its own under /tmp.
        self.socket_folder = Path(tempfile.mkdtemp(prefix="lockstep-munge-"))
        self.socket_folder.chmod(0o755)
        self.socket = self.socket_folder / "munge.sock"
        self.holders = holders
        self.job_secrets = job_secrets
        self.job_secret_key = secrets.token_hex(32) if job_secrets else ""
        self.secret_dir = self.folder / "job-secrets"

    # --- environment -----------------------------------------------------------------------------------------
    @property
    def env(self) -> dict:
        """The environment the CLI tools need to speak to this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def connection(self, **extra) -> dict:
        """The connection settings of a Lockstep cluster on this Slurm (fleet/drivers/slurm.py)."""
        secret = {"job_secret_key": self.job_secret_key} if self.job_secrets else {}
        return {
            "slurm_conf": str(self.conf),
            "spare_partition": "spare" if self.spares else "",
            **secret,
            **extra,
        }

    def job_secret(self, slurm_job_id: str, timeout: float = 10) -> str:
        """The secret the prolog wrote for the job, as its tasks get it (waits for the prolog of its first node)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for path in sorted(self.secret_dir.glob(f"*/{slurm_job_id}")):
                found = path.read_text().strip()
                if found:
                    return found
            time.sleep(0.1)
        raise TimeoutError(f"no job secret written for Slurm job {slurm_job_id}: {self.log()[-800:]}")

    def run(
        self, *args: str, check: bool = True, timeout: float = 30, env: dict | None = None
    ) -> subprocess.CompletedProcess:
        command = list(args) if len(args) > 1 else args[0].split()
        done = subprocess.run(
            command,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip() or done.stdout.strip()}")
        return done

    def log(self, daemon: str = "slurmctld") -> str:
        path = self.folder / "log" / f"{daemon}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # --- start and stop --------------------------------------------------------------------------------------
    def _write_config(self) -> None:
        ctld_port, slurmd_port, *node_ports = _free_ports(2 + len(self.names))
        folder = self.folder
        for sub in ("state", "log", "spool"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        key = folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        nodes = []
        for name, port in zip(self.names, node_ports, strict=True):
            weight = 10 if name in self.spares else 1
            nodes.append(
                f"NodeName={name} NodeAddr=127.0.0.1 Port={port} CPUs={self.cpus} RealMemory=1000 "
                f"Weight={weight} Feature={self.features} Gres=gpu:{self.gpus}"
            )
        partitions = [
            f"PartitionName=main Nodes={','.join(self.names)} Default=YES MaxTime=INFINITE State=UP"
        ]
        if self.spares:
            partitions.append(f"PartitionName=spare Nodes={','.join(self.spares)} MaxTime=INFINITE State=UP")
        self.conf.write_text(
            "\n".join(
                [
                    f"ClusterName={self.cluster_name}",
                    "SlurmctldHost=localhost(127.0.0.1)",
                    f"SlurmctldPort={ctld_port}",
                    f"SlurmdPort={slurmd_port}",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.socket},cred_expire={self.cred_expire}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"StateSaveLocation={folder / 'state'}",
                    f"SlurmdSpoolDir={folder / 'spool'}/%n",
                    f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
                    f"SlurmdPidFile={folder / 'spool'}/%n/slurmd.pid",
                    f"SlurmctldLogFile={folder / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={folder / 'log'}/slurmd-%n.log",
                    "ProctrackType=proctrack/pgid",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "ReturnToService=2",
                    "MpiDefault=none",
                    f"SlurmdTimeout={self.slurmd_timeout}",
                    "SlurmctldTimeout=10",
                    "MessageTimeout=5",
                    "InactiveLimit=0",
                    "MinJobAge=600",
                    "KillWait=2",
                    "JobRequeue=1",
                    "SchedulerType=sched/backfill",
                    "SchedulerParameters=sched_interval=1",
                    "GresTypes=gpu",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    *nodes,
                    *partitions,
                    "",
                ]
            )
        )
        gres = ["AutoDetect=off"]
        for name in self.names:
            devices = folder / "dev" / name
            devices.mkdir(parents=True, exist_ok=True)
            for i in range(self.gpus):
                (devices / f"gpu{i}").touch()
            gres.append(f"NodeName={name} Name=gpu File={devices}/gpu[0-{self.gpus - 1}]")
        (folder / "gres.conf").write_text("\n".join(gres) + "\n")
        # No cgroups here (task/none, proctrack/pgid); slurmd still loads a cgroup plugin, and the host's hybrid
        # mount only suits v1.
        (folder / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
        if self.job_secrets:
            with self.conf.open("a") as conf:
                conf.write("\n".join(self._write_job_secret_scripts()) + "\n")

    def _write_job_secret_scripts(self) -> list[str]:
        """The key (root's only) and the three scripts of ``lockstep_agent.launcher``; their slurm.conf lines."""
        key = self.folder / "job-secret.key"
        key.write_text(self.job_secret_key + "\n")
        key.chmod(0o600)
        self.secret_dir.mkdir(mode=0o711, exist_ok=True)
        agent = Path(__file__).resolve().parents[2] / "agent"
        # One folder per emulated node: they share a host here, where a real node has its own /run.
        per_node = shlex.quote(f"{self.secret_dir}/{{node}}")
        lines = []
        for setting, command, extra in (
            ("Prolog", "prolog", f" --key-file {shlex.quote(str(key))}"),
            ("TaskProlog", "task-prolog", ""),
            ("Epilog", "epilog", ""),
        ):
            script = self.folder / f"lockstep-{command}.sh"
            script.write_text(
                "#!/bin/sh\n"
                f"PYTHONPATH={shlex.quote(str(agent))} exec {shlex.quote(sys.executable)} -m lockstep_agent.launcher "
                f"{command} --secret-dir {per_node}{extra}\n"
            )
            script.chmod(0o755)
            lines.append(f"{setting}={script}")
        return lines

    def _spawn(self, key: str, args: list[str]) -> subprocess.Popen:
        log = (self.folder / "log" / f"{key}.out").open("w")
        process = subprocess.Popen(
            args, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.processes[key] = process
        return process

    def start(self) -> "SlurmCluster":
        self._write_config()
        folder = self.folder
        self._spawn(
            "munged",
            [
                _binary("munged"),
                "--foreground",
                f"--key-file={folder / 'munge.key'}",
                f"--socket={self.socket}",
                f"--pid-file={folder / 'munged.pid'}",
                f"--log-file={folder / 'log' / 'munged.log'}",
                f"--seed-file={folder / 'munge.seed'}",
            ],
        )
        self._wait(lambda: self.socket.exists(), 60, "munged")
        self._spawn("slurmctld", [_binary("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self.run("scontrol", "ping", check=False).stdout.count("UP") > 0, 90, "slurmctld")
        for name in self.names:
            self.start_node(name)
        self._wait(lambda: self.idle_nodes() >= len(self.names), 120, "slurmd nodes idle")
        return self

    def holder_socket(self, name: str = "{node}") -> str:
        """Node ``name``'s snapshot holder socket (``{node}`` left in: the template a job script fills in). Under
        /tmp: a socket path must be short."""
        return str(self.socket_folder / f"holder-{name}.sock")

    def start_holder(self, name: str) -> subprocess.Popen:
        agent = Path(__file__).resolve().parents[2] / "agent"
        path = Path(self.holder_socket(name))
        path.unlink(missing_ok=True)
        process = subprocess.Popen(
            [sys.executable, "-m", "lockstep_agent.snapshot_holder", "--socket", str(path)],
            env={**self.env, "PYTHONPATH": str(agent)},
            stdout=(self.folder / "log" / f"holder-{name}.out").open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.processes[f"holder-{name}"] = process
        self._wait(path.exists, 60, f"the snapshot holder of {name}")
        return process

    def start_node(self, name: str) -> subprocess.Popen:
        (self.folder / "spool" / name).mkdir(parents=True, exist_ok=True)
        if self.holders and (
            self.processes.get(f"holder-{name}") is None
            or self.processes[f"holder-{name}"].poll() is not None
        ):
            self.start_holder(name)
        return self._spawn(f"slurmd-{name}", [_binary("slurmd"), "-D", "-N", name, "-f", str(self.conf)])

    def idle_nodes(self) -> int:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split("\n")
        return len({line.split()[0] for line in out if line.strip().endswith("idle")})

    def _wait(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if predicate():
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            time.sleep(0.2)
        raise TimeoutError(f"timed out waiting for {what}: {self.log()[-1500:]}")

    def kill_node(self, name: str, rank_pids: list[int] = ()) -> float:
        """A node dies: its slurmd, its snapshot holder (and the memory it kept), the step daemons it started and
        their ranks (``rank_pids``, as the ranks reported them) are killed at once. Returns the time (epoch
        seconds) it happened."""
        victims = set(rank_pids)
        for pid in rank_pids:
            parent = _parent(pid)
            if parent and _cmdline(parent).startswith("slurmstepd"):
                victims.add(parent)
        at = time.time()
        for key in (f"slurmd-{name}", f"holder-{name}"):
            process = self.processes.get(key)
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        for pid in victims:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return at

    def stop(self) -> None:
        for key in sorted(self.processes, key=lambda k: (k == "munged", k == "slurmctld")):
            process = self.processes[key]
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                try:
                    process.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        # Step daemons and job processes were started by the slurmd in sessions of their own: end whatever still
        # runs with this cluster's configuration or folder in its environment.
        own_group = os.getpgrp()
        for pid in _pids_with(str(self.folder)):
            try:
                if os.getpgid(pid) != own_group:
                    os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

        shutil.rmtree(self.socket_folder, ignore_errors=True)

    def __enter__(self) -> "SlurmCluster":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()


def _parent(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _pids_with(marker: str) -> list[int]:
    """Processes whose command line or environment names ``marker`` (this cluster's folder)."""
    found, own = [], os.getpid()
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            if needle in (entry / "cmdline").read_bytes() or needle in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found
