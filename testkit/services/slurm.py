"""A real Slurm + munge + sshd lab on loopback, started and stopped by the test fixture.

Everything lives under one lab folder: configs, keys, state, logs, pid files. Nothing is
installed here (``scripts/lab_install.sh`` does that in CI); a missing binary is an error that
names the script to run.

Why the details below:
- ports are picked free at start-up (slurmctld/slurmd listen on 0.0.0.0), below the ephemeral
  range, so two labs on one machine never collide; a port taken anyway before a daemon binds it
  starts slurm again on fresh ports;
- every daemon runs in the foreground as our child, with ``PR_SET_PDEATHSIG`` so that a killed
  pytest takes its daemons with it;
- at teardown jobs are cancelled first (slurmstepd is reparented to PID 1 and outlives slurmd),
  then any leftover process whose environment names this lab is ended by its pid.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from testkit.services.net import free_port, free_port_block

__all__ = ["LabError", "SlurmLab", "REQUIRED_BINARIES"]

REQUIRED_BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "scontrol", "squeue",
                     "sbatch", "scancel", "sinfo", "sshd", "ssh-keygen")
_PR_SET_PDEATHSIG = 1


class LabError(RuntimeError):
    """The lab could not be started; the message says which daemon and where its log is."""


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: if pytest dies, the daemon gets SIGTERM.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _binary(name: str) -> str:
    for folder in ("/usr/sbin", "/usr/bin", "/sbin", "/bin"):
        candidate = Path(folder) / name
        if candidate.exists():
            return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise LabError(f"{name} is not installed; run `bash scripts/lab_install.sh` first")
    return found


@dataclass
class SlurmLab:
    """One lab: ``start()`` brings munged, slurmctld, a slurmd per node and sshd up."""

    root: Path
    node_count: int = 16
    node_prefix: str = "gpu-node-"
    nodes: list[str] = field(init=False)
    ctld_port: int = field(init=False, default=0)
    ssh_port: int = field(init=False, default=0)
    _procs: dict[str, subprocess.Popen[bytes]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.nodes = [f"{self.node_prefix}{i:03d}" for i in range(1, self.node_count + 1)]

    # -- paths ---------------------------------------------------------------------------
    @property
    def slurm_conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def client_key(self) -> Path:
        return self.root / "ssh" / "client_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.root / "ssh" / "known_hosts"

    @property
    def host_public_key(self) -> str:
        return (self.root / "ssh" / "ssh_host_ed25519_key.pub").read_text().split()[1]

    @property
    def ctld_log(self) -> Path:
        return self.root / "log" / "slurmctld.log"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.slurm_conf)}

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> None:
        binaries = {name: _binary(name) for name in REQUIRED_BINARIES}
        # munged requires execute-for-all on every folder above its socket.
        self.root.chmod(0o755)
        for sub in ("etc", "munge", "state", "spool", "log", "ssh", "jobs", "home"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        try:
            self._start_munge(binaries)
            self._start_slurm_on_free_ports(binaries)
            self._start_sshd(binaries)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Cancel jobs, stop every daemon, then end leftovers of this lab by pid. Never raises."""
        if "slurmctld" in self._procs and self._procs["slurmctld"].poll() is None:
            # Bounded, and given up on a timeout: a terminal's Ctrl-C reaches the lab's daemons too
            # (they share the demo's process group), and with munged gone scancel and squeue retry
            # for longer than the demo's teardown waits, which left the lab's folder behind.
            try:
                subprocess.run(["scancel", "--user=root", "--full"], env=self.env,
                               capture_output=True, timeout=5, check=False)
                self._wait_for_no_jobs(5.0)
            except (subprocess.TimeoutExpired, OSError):
                pass  # the jobs end with their slurmd below
        for name in sorted(self._procs, key=lambda n: (n != "sshd", n.startswith("slurmctld"))):
            self._terminate(name)
        self._reap_lab_leftovers()
        self._procs.clear()

    # -- commands the tests use ----------------------------------------------------------
    def run(self, argv: Sequence[str], *, check: bool = True,
            timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command locally against this lab (for test set-up and checks)."""
        proc = subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise LabError(f"{' '.join(argv)} failed rc={proc.returncode}: "
                           f"{proc.stdout.strip()} {proc.stderr.strip()}")
        return proc

    def node_line(self, node: str) -> str:
        return self.run(["scontrol", "-o", "show", "node", node]).stdout

    def state_of(self, node: str) -> str:
        for token in self.node_line(node).split():
            if token.startswith("State="):
                return token.removeprefix("State=")
        raise LabError(f"no State= in scontrol output for {node}")

    def states(self) -> dict[str, str]:
        """Every node's ``State=`` in one ``scontrol`` call."""
        states = {}
        for line in self.run(["scontrol", "-o", "show", "node"]).stdout.splitlines():
            fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
            if "NodeName" in fields:
                states[fields["NodeName"]] = fields.get("State", "")
        return states

    def reset_nodes(self) -> None:
        """Cancel every job, resume drained/down nodes, clear features and comments: a clean start.

        A resumed node may show ``IDLE+NOT_RESPONDING`` for a few seconds (a Slurm quirk); that
        is clean enough for isolation tests, which is why tests never wait for plain ``IDLE``.
        """
        self.run(["scancel", "--user=root", "--full"], check=False)
        self._wait_for_no_jobs(10.0)
        for line in self.run(["scontrol", "-o", "show", "node"]).stdout.splitlines():
            fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
            node, state = fields.get("NodeName", ""), fields.get("State", "")
            if "DRAIN" in state or "DOWN" in state:
                self.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)
            if fields.get("AvailableFeatures", "(null)") not in ("(null)", ""):
                self.run(["scontrol", "update", f"NodeName={node}", "AvailableFeatures=",
                          "ActiveFeatures="], check=False)
            if " Comment=" in line or " Extra=" in line:
                self.run(["scontrol", "update", f"NodeName={node}", "Comment=", "Extra="], check=False)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            states = self.states()
            if not any(flag in s for s in states.values() for flag in ("DRAIN", "DOWN", "ALLOC", "MIXED")):
                return
            time.sleep(0.1)
        raise LabError(f"nodes did not come back: {states}")

    def set_opt_out(self, node: str, feature: str = "denpex_opt_out") -> None:
        self.run(["scontrol", "update", f"NodeName={node}", f"AvailableFeatures={feature}",
                  f"ActiveFeatures={feature}"])

    def known_hosts_line(self, port: int) -> str:
        """The known_hosts line for the lab's host key when reached on ``port`` (e.g. via a proxy)."""
        return f"[127.0.0.1]:{port} ssh-ed25519 {self.host_public_key}\n"

    def client_conf(self, name: str, ctld_port: int, *, message_timeout_s: int = 1) -> Path:
        """A copy of slurm.conf for clients only, sending them to ``ctld_port`` instead of slurmctld.

        With ``env SLURM_CONF=<it>`` the real ``scontrol``/``squeue`` fail the way they do when the
        controller is away: a closed port gives "Unable to contact slurm controller (connect
        failure)", a port that never answers gives "Socket timed out on send/recv operation".
        Clients keep trying to connect for about ``MessageTimeout`` seconds (10 by default, 1 here).
        """
        text = self.slurm_conf.read_text().replace(f"SlurmctldPort={self.ctld_port}\n",
                                                   f"SlurmctldPort={ctld_port}\n")
        text += f"MessageTimeout={message_timeout_s}\n"
        conf = self.root / "etc" / f"{name}.conf"
        conf.write_text(text)
        return conf

    def update_rpc_count(self, node: str) -> int:
        """How many ``scontrol update`` requests slurmctld served for ``node`` (debug2 log)."""
        text = self.ctld_log.read_text(errors="replace")
        return text.count(f"_slurm_rpc_update_node complete for {node} ")

    def submit_sleep(self, node: str, seconds: int = 600) -> str:
        """``sbatch`` a real ``sleep`` on ``node``; returns the job id once it is RUNNING."""
        return self.submit_job([f"--nodelist={node}", "--ntasks=1"], seconds=seconds)

    def submit_job(self, options: list[str], *, seconds: int = 600, output: Path | None = None,
                   timeout_s: float = 120) -> str:
        """``sbatch`` a real ``sleep`` with ``options`` (nodes, tasks); its id once it is RUNNING.

        The bound is sized for a loaded machine: a job submitted while its nodes still finish an
        earlier test's job waits for slurmctld's next scheduling pass. A job that never runs is
        reported with Slurm's own reason for keeping it pending.
        """
        out = self.run(["sbatch", "--parsable", *options,
                        f"--output={output or self.root / 'jobs' / 'slurm-%j.out'}",
                        f"--wrap=sleep {seconds}"]).stdout.strip()
        job_id = out.split(";")[0]
        deadline = time.monotonic() + timeout_s
        while (state := self.job_state(job_id)) != "RUNNING":
            if time.monotonic() > deadline:
                reason = self.run(["squeue", "-h", "-j", job_id, "-o", "%T %r"], check=False).stdout.strip()
                raise LabError(f"job {job_id} ({' '.join(options)}) did not start running within "
                               f"{timeout_s:.0f} s: {reason or state or 'not in squeue'}")
            time.sleep(0.1)
        return job_id

    def job_state(self, job_id: str) -> str:
        return self.run(["squeue", "-h", "-j", job_id, "-o", "%T"], check=False).stdout.strip()

    # -- internals -----------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            proc = subprocess.Popen(argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        self._procs[name] = proc
        return proc

    def _start_munge(self, b: dict[str, str]) -> None:
        munge = self.root / "munge"
        munge.chmod(0o755)  # munged refuses a socket folder without execute for all
        key = munge / "munge.key"
        if not key.exists():
            subprocess.run([b["mungekey"], "-c", "-k", str(key)], check=True, capture_output=True)
        self._spawn("munged", [b["munged"], "-F", f"--key-file={key}",
                               f"--socket={munge / 'munge.socket.2'}",
                               f"--pid-file={munge / 'munged.pid'}",
                               f"--log-file={self.root / 'log' / 'munged.log'}",
                               f"--seed-file={munge / 'munged.seed'}"],
                    self.root / "log" / "munged.out")
        self._wait(lambda: (munge / "munge.socket.2").exists(), "munged", 10.0,
                   self.root / "log" / "munged.log")

    def _write_slurm_conf(self) -> None:
        base = free_port_block(self.node_count + 2)
        self.ctld_port = base
        lab = self.root
        first, last = 1, self.node_count
        self.slurm_conf.write_text(
            "\n".join([
                "ClusterName=lab",
                "SlurmctldHost=localhost",
                "SlurmUser=root",
                f"SlurmctldPort={base}",
                f"SlurmdPort={base + 1}",
                "AuthType=auth/munge",
                f"AuthInfo=socket={lab / 'munge' / 'munge.socket.2'}",
                f"StateSaveLocation={lab / 'state'}",
                f"SlurmdSpoolDir={lab / 'spool'}/%n",
                f"SlurmctldPidFile={lab / 'slurmctld.pid'}",
                f"SlurmdPidFile={lab}/slurmd-%n.pid",
                f"SlurmctldLogFile={lab / 'log' / 'slurmctld.log'}",
                f"SlurmdLogFile={lab / 'log'}/slurmd-%n.log",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "MpiDefault=none",
                "MailProg=/bin/true",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core",
                "ReturnToService=1",
                # A job that had to wait for its nodes (still finishing an earlier test's job) is
                # looked at again within seconds, not at the default 60 s pass.
                "SchedulerParameters=sched_interval=2",
                "SlurmdTimeout=60",
                "SlurmdParameters=config_overrides",
                "SlurmctldDebug=debug2",
                # NodeAddr avoids 10 s of DNS per node, during which SIGTERM is ignored.
                f"NodeName={self.node_prefix}[{first:03d}-{last:03d}] NodeAddr=127.0.0.1 "
                f"Port=[{base + 2}-{base + 1 + self.node_count}] CPUs=8 State=UNKNOWN",
                "PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
                "",
            ])
        )

    def _start_slurm_on_free_ports(self, b: dict[str, str], attempts: int = 3) -> None:
        """Start slurmctld and the slurmds; on a port taken between the check and the bind, retry.

        A free port can still be taken by another lab's daemons before ours bind it. Only that
        failure is retried, on a fresh block of ports; the clashing attempt's logs are kept.
        """
        for attempt in range(1, attempts + 1):
            self._write_slurm_conf()
            try:
                self._start_slurm(b)
                return
            except LabError:
                if attempt == attempts or not self._port_was_taken():
                    raise
            self._stop_slurm_daemons()
            self._set_logs_aside(f"port-clash-{attempt}")

    def _port_was_taken(self) -> bool:
        logs = [self.ctld_log, *(self.root / "log").glob("slurmd-*.log")]
        return any("Address already in use" in log.read_text(errors="replace")
                   for log in logs if log.exists())

    def _stop_slurm_daemons(self) -> None:
        for name in [n for n in self._procs if n.startswith("slurm")]:
            self._terminate(name)
            del self._procs[name]

    def _set_logs_aside(self, folder: str) -> None:
        aside = self.root / "log" / folder
        aside.mkdir()
        for log in (self.root / "log").glob("slurm*"):
            if log.is_file():
                log.rename(aside / log.name)

    def _start_slurm(self, b: dict[str, str]) -> None:
        self._spawn("slurmctld", [b["slurmctld"], "-D", "-i"], self.root / "log" / "slurmctld.out")
        self._wait(lambda: "UP" in self.run(["scontrol", "ping"], check=False).stdout,
                   "slurmctld", 20.0, self.ctld_log)
        for node in self.nodes:
            (self.root / "spool" / node).mkdir(parents=True, exist_ok=True)
            self._spawn(f"slurmd-{node}", [b["slurmd"], "-D", "-N", node],
                        self.root / "log" / f"slurmd-{node}.out")

        def all_idle() -> bool:
            out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False).stdout
            states = dict(line.split() for line in out.splitlines() if line.strip())
            return len(states) == self.node_count and all(s == "idle" for s in states.values())

        self._wait(all_idle, "slurmd", 30.0, self.root / "log")

    def _start_sshd(self, b: dict[str, str]) -> None:
        ssh = self.root / "ssh"
        host_key = ssh / "ssh_host_ed25519_key"
        for key in (host_key, self.client_key):
            if not key.exists():
                subprocess.run([b["ssh-keygen"], "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
                               check=True, capture_output=True)
        (ssh / "authorized_keys").write_text((ssh / "client_ed25519.pub").read_text())
        self.ssh_port = free_port()
        config = ssh / "sshd_config"
        config.write_text("\n".join([
            f"Port {self.ssh_port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {host_key}",
            f"PidFile {ssh / 'sshd.pid'}",
            f"AuthorizedKeysFile {ssh / 'authorized_keys'}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "AllowUsers root",
            # A lab HOME keeps the machine's ~/.bashrc (pyenv init and the like: ~0.3 s per
            # command) out of every remote command; Slurm does not use HOME.
            f"SetEnv SLURM_CONF={self.slurm_conf} HOME={self.root / 'home'}",
            "AcceptEnv SLURM_*",
            "",
        ]))
        self.known_hosts.write_text(self.known_hosts_line(self.ssh_port))
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        check = subprocess.run([b["sshd"], "-t", "-f", str(config)], capture_output=True, text=True)
        if check.returncode != 0:
            raise LabError(f"sshd rejected {config}: {check.stderr.strip()}")
        log = self.root / "log" / "sshd.log"
        self._spawn("sshd", [b["sshd"], "-D", "-f", str(config), "-E", str(log)],
                    self.root / "log" / "sshd.out")
        self._wait(lambda: log.exists() and "Server listening" in log.read_text(), "sshd", 10.0, log)

    def _wait(self, ready: object, name: str, timeout: float, log: Path) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if callable(ready) and ready():
                return
            dead = [n for n, p in self._procs.items() if n.startswith(name) and p.poll() is not None]
            if dead:
                raise LabError(f"{dead[0]} exited during start-up; see {log}")
            time.sleep(0.05)
        raise LabError(f"{name} not ready after {timeout:.0f} s; see {log}")

    def _wait_for_no_jobs(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.run(["squeue", "-h", "-o", "%i"], check=False, timeout=max(0.5, deadline - time.monotonic()))
            if out.returncode != 0 or not out.stdout.strip():
                return
            time.sleep(0.1)

    def _terminate(self, name: str) -> None:
        proc = self._procs[name]
        if proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def _reap_lab_leftovers(self) -> None:
        """End processes this lab started indirectly (slurmstepd, job steps, sshd sessions).

        They are found by the lab folder in their environment or command line, so nothing
        else on the machine is touched.
        """
        marker = str(self.root).encode()
        me = os.getpid()
        for _ in range(3):
            leftovers = []
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit() or int(entry.name) == me:
                    continue
                try:
                    blob = (entry / "environ").read_bytes() + (entry / "cmdline").read_bytes()
                    stat = (entry / "stat").read_text()
                except OSError:
                    continue
                if marker in blob and stat.rsplit(")", 1)[-1].split()[0] != "Z":
                    leftovers.append(int(entry.name))
            if not leftovers:
                return
            for pid in leftovers:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
