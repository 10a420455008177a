"""A real SLURM on this host: munged, slurmctld and one ``slurmd`` per virtual node.

``VirtualSlurm(workdir)`` writes a minimal ``slurm.conf`` into ``workdir`` and starts the
daemons of the Debian packages (``slurmctld slurmd slurm-client munge``; installing them is
CI's job, ``.ci/cluster-setup``), without systemd, each by its own pid file: munged as the
``munge`` user (unless one is running already), slurmctld, and ``slurmd -N NAME`` for each
virtual node, each with its own ``Port=`` and spool directory. The node names are aliases of
127.0.0.1 in ``/etc/hosts`` (added by :meth:`~VirtualSlurm.start`, removed by
:meth:`~VirtualSlurm.stop`). The client programs (``srun``, ``salloc``, ``sbatch``) find the
cluster through ``SLURM_CONF``: run them with :attr:`~VirtualSlurm.env`.

What makes it work in a container: ``SlurmdParameters=config_overrides`` (each node claims
``cpus`` CPUs, more than the machine has), ``ProctrackType=proctrack/linuxproc`` and
``TaskPlugin=task/none`` (no cgroups). The ports are fixed (:data:`CTLD_PORT` and the ones
after it): one such cluster per host at a time. Root only;
:func:`unavailable_reason` says why it cannot start here (tests skip with that reason)::

    with VirtualSlurm(tmp_path) as slurm:
        subprocess.run(["srun", "-N2", "hostname"], env=slurm.env, check=True)
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from pskv.testing.jobs import child_env

__all__ = ["CTLD_PORT", "NODES", "PROGRAMS", "VirtualSlurm", "unavailable_reason"]

NODES = ("pskvn1", "pskvn2")  # the virtual nodes' names (aliases of 127.0.0.1)
CTLD_PORT = 16817  # slurmctld's; the slurmd's take the ports after it
PROGRAMS = ("munged", "slurmctld", "slurmd", "srun", "salloc", "sbatch", "sinfo", "squeue", "scancel")
_HOSTS = "/etc/hosts"
_MARK = "# pskv.testing.slurm"
_MUNGE_PID = "/run/munge/munged.pid"


def unavailable_reason() -> str:
    """Why a :class:`VirtualSlurm` cannot start here ('' when it can): not root, or a program missing."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "a real SLURM needs root here (its daemons, /etc/hosts aliases, munged as the munge user)"
    missing = [p for p in PROGRAMS if shutil.which(p) is None and not os.path.exists(f"/usr/sbin/{p}")]
    if missing:
        return (f"SLURM is not installed ({', '.join(missing)} missing): .ci/cluster-setup installs "
                "slurmctld slurmd slurm-client munge with apt")
    return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (this machine's PID 1 reaps late) is gone for our purposes
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _read_pid(path: str | Path) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def _stop_pid(pid: int | None, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds."""
    if pid is None or not _alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    limit = time.monotonic() + grace
    while _alive(pid) and time.monotonic() < limit:
        time.sleep(0.05)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


class VirtualSlurm:
    """A SLURM cluster of ``len(nodes)`` virtual nodes with ``cpus`` CPUs each, on this host.

    Args:
        workdir: where its configuration, state, spool directories, pid files and logs go.
        nodes: the nodes' names (aliases of 127.0.0.1 while it runs).
        cpus: CPUs each node claims (``config_overrides``: more than the machine has is fine).

    Raises (:meth:`start`):
        RuntimeError: a daemon did not start, or the nodes did not become idle within
            ``timeout`` seconds (the daemons' log lines are in the message).
    """

    def __init__(self, workdir: str | os.PathLike[str], nodes: Sequence[str] = NODES, cpus: int = 4) -> None:
        self.workdir = Path(workdir)
        self.nodes = tuple(nodes)
        self.cpus = cpus
        self.conf = self.workdir / "slurm.conf"
        self.env = child_env({"SLURM_CONF": str(self.conf)})  # this process's environment (and pskv on PYTHONPATH)
        self._started_munged = False

    def __enter__(self) -> VirtualSlurm:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _config(self) -> str:
        w = self.workdir
        lines = [
            "ClusterName=pskv", f"SlurmctldHost={socket.gethostname()}(127.0.0.1)", f"SlurmctldPort={CTLD_PORT}",
            "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", "CredType=cred/munge",
            f"StateSaveLocation={w}/state", f"SlurmdSpoolDir={w}/spool-%n",
            f"SlurmctldPidFile={w}/slurmctld.pid", f"SlurmdPidFile={w}/slurmd-%n.pid",
            f"SlurmctldLogFile={w}/slurmctld.log", f"SlurmdLogFile={w}/slurmd-%n.log",
            "SlurmdParameters=config_overrides", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "MpiDefault=none", "SwitchType=switch/none", "ReturnToService=2", "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "KillWait=5", "MinJobAge=2",
            "InactiveLimit=0", "SlurmctldTimeout=30", "SlurmdTimeout=60", "MessageTimeout=10",
        ]
        for i, name in enumerate(self.nodes):
            lines.append(f"NodeName={name} NodeAddr=127.0.0.1 CPUs={self.cpus} Port={CTLD_PORT + 1 + i} "
                         "State=UNKNOWN")
        lines.append("PartitionName=pskv Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def start(self, timeout: float = 60.0) -> None:
        """Write the configuration, start the daemons, and wait until every node is idle."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "state").mkdir(exist_ok=True)
        self.conf.write_text(self._config())
        try:
            self._add_aliases()
            self._start_munged()
            self._daemon(["slurmctld", "-c", "-f", str(self.conf)], self.workdir / "slurmctld.pid")
            for name in self.nodes:
                (self.workdir / f"spool-{name}").mkdir(exist_ok=True)
                self._daemon(["slurmd", "-N", name, "-f", str(self.conf)], self.workdir / f"slurmd-{name}.pid")
            self._wait_idle(timeout)
        except BaseException:
            self.stop()
            raise

    def _add_aliases(self) -> None:
        text = Path(_HOSTS).read_text()
        if _MARK not in text:
            Path(_HOSTS).write_text(text.rstrip("\n") + f"\n127.0.0.1 {' '.join(self.nodes)} {_MARK}\n")

    def _remove_aliases(self) -> None:
        try:
            lines = Path(_HOSTS).read_text().splitlines(keepends=True)
            Path(_HOSTS).write_text("".join(line for line in lines if _MARK not in line))
        except OSError:
            pass

    def _start_munged(self) -> None:
        pid = _read_pid(_MUNGE_PID)
        if pid is not None and _alive(pid):
            return
        os.makedirs("/run/munge", exist_ok=True)
        shutil.chown("/run/munge", "munge", "munge")
        subprocess.run(["munged", "--force"], user="munge", group="munge", check=True, timeout=30,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._started_munged = True

    def _daemon(self, argv: list[str], pid_file: Path) -> None:
        pid_file.unlink(missing_ok=True)
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)
        limit = time.monotonic() + 10
        while _read_pid(pid_file) is None and time.monotonic() < limit:
            time.sleep(0.05)
        if done.returncode != 0 or _read_pid(pid_file) is None:
            raise RuntimeError(f"{' '.join(argv)} did not start (exit {done.returncode}): "
                               f"{done.stderr.strip()} {self.logs()}")

    def _wait_idle(self, timeout: float) -> None:
        limit = time.monotonic() + timeout
        states = ""
        while time.monotonic() < limit:
            done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True,
                                  text=True, timeout=30)
            states = done.stdout.strip()
            idle = {line.split()[0] for line in states.splitlines() if line.endswith(" idle")}
            if idle >= set(self.nodes):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the SLURM nodes did not become idle within {timeout:g} s: {states!r} {self.logs()}")

    def logs(self, lines: int = 8) -> str:
        """The last ``lines`` lines of each daemon's log, for an error message."""
        out = []
        for log in sorted(self.workdir.glob("slurm*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name}:\n" + "\n".join(tail))
        return "\n".join(out)

    def run(self, argv: Sequence[str], timeout: float = 60.0, **kwargs: object) -> subprocess.CompletedProcess[str]:
        """Run a client command (``squeue``, ``scancel``...) against this cluster; its output as text."""
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout,
                              **kwargs)  # type: ignore[call-overload]

    def jobs(self) -> list[str]:
        """``squeue``'s lines of the jobs and steps still there (pending, running or completing)."""
        jobs = self.run(["squeue", "-h", "-o", "%i %j %T"]).stdout.splitlines()
        steps = self.run(["squeue", "-h", "-s", "-o", "%i %j"]).stdout.splitlines()
        return [line for line in jobs + steps if line.strip()]

    def stop(self) -> None:
        """Cancel every job, stop the daemons (slurmd's, slurmctld, munged if it started it), remove the aliases."""
        if _read_pid(self.workdir / "slurmctld.pid") is not None:
            try:
                self.run(["scancel", "--full", "--user=root"], timeout=10)
            except (OSError, subprocess.SubprocessError):
                pass
        for name in self.nodes:
            _stop_pid(_read_pid(self.workdir / f"slurmd-{name}.pid"))
        _stop_pid(_read_pid(self.workdir / "slurmctld.pid"))
        if self._started_munged:
            _stop_pid(_read_pid(_MUNGE_PID))
            self._started_munged = False
        self._remove_aliases()
