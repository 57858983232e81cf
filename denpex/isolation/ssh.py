"""Run argv commands on a controller or login node over SSH (paramiko).

Security and failure rules:
- the host key must already be in ``known_hosts``; unknown or changed keys are refused
  (``RejectPolicy``) and never retried;
- key authentication only: no agent, no key search, no passwords;
- every wait has a timeout (connect, banner, auth, command);
- the remote command line is ``shlex.join(argv)``: each argument is quoted, nothing is formatted
  into a shell string;
- connection errors before a command is sent are retried with exponential backoff; a drop after
  a state-changing command was sent raises ``OutcomeUnknownError`` so the caller reads the real
  state instead of repeating the command blindly.
"""

from __future__ import annotations

import shlex
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import paramiko
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from denpex.isolation.errors import (
    ConfigError,
    HostKeyError,
    OutcomeUnknownError,
    RemoteAuthError,
    RemoteError,
    TransientRemoteError,
)

__all__ = ["SshSettings", "CommandResult", "CommandRunner", "SshRunner", "Backoff"]

_POLL_S = 0.005
_EOF_GRACE_S = 10.0
"""How long the output may go on after the exit status before a lingering child is left to it."""


class Backoff(BaseModel):
    """Exponential backoff for transient errors: ``attempts`` tries, waits doubling to ``max_s``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    attempts: int = Field(default=4, ge=1, le=20)
    initial_s: float = Field(default=0.5, ge=0.0)
    max_s: float = Field(default=8.0, ge=0.0)

    def delays(self) -> list[float]:
        """Waits between attempts: ``attempts=4, initial_s=0.5`` -> ``[0.5, 1.0, 2.0]``."""
        return [min(self.initial_s * 2**i, self.max_s) for i in range(self.attempts - 1)]


class SshSettings(BaseModel):
    """How to reach the node that runs ``scontrol``/``squeue``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str
    port: int = Field(default=22, ge=1, le=65535)
    username: str = "root"
    key_path: Path
    key_passphrase: SecretStr | None = None
    known_hosts: Path
    connect_timeout_s: float = Field(default=10.0, gt=0)
    command_timeout_s: float = Field(default=60.0, gt=0)
    backoff: Backoff = Backoff()


class CommandResult(BaseModel):
    """One finished remote command."""

    model_config = ConfigDict(frozen=True)

    argv: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str

    @property
    def command(self) -> str:
        """The exact command line sent (each argument shell-quoted)."""
        return shlex.join(self.argv)

    @property
    def output(self) -> str:
        return (self.stdout + self.stderr).strip()


class CommandRunner(Protocol):
    """Runs one argv on the cluster's control node. ``changes_state`` marks non-idempotent runs."""

    def run(self, argv: Sequence[str], *, changes_state: bool = False) -> CommandResult: ...


class _RefuseUnknownHost(paramiko.MissingHostKeyPolicy):
    """``RejectPolicy`` with an error we can tell apart from a dropped connection."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise HostKeyError(
            f"host key of {hostname} ({key.get_name()} {key.get_fingerprint().hex()}) is not in "
            "known_hosts; nothing was sent. Verify the fingerprint out of band and add the key "
            "to the known_hosts file named in the SSH settings"
        )


class SshRunner:
    """One SSH connection, opened on first use and reopened after a transient failure.

    Use as a context manager so the connection is closed in the scope that opened it.
    """

    def __init__(self, settings: SshSettings, *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.settings = settings
        self._sleep = sleep
        self._client: paramiko.SSHClient | None = None

    def __enter__(self) -> SshRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    @property
    def target(self) -> str:
        return f"{self.settings.username}@{self.settings.host}:{self.settings.port}"

    def run(self, argv: Sequence[str], *, changes_state: bool = False) -> CommandResult:
        """Run ``argv`` remotely and return its rc and output (a non-zero rc is not an error).

        Transient failures are retried with backoff when nothing was sent yet, or when the
        command only reads. A drop after sending a state-changing command raises
        ``OutcomeUnknownError``.
        """
        if not argv or any(not isinstance(a, str) for a in argv):
            raise ValueError(f"argv must be a non-empty list of strings, got {argv!r}")
        delays = iter(self.settings.backoff.delays())
        attempt = 0
        while True:
            attempt += 1
            sent = False
            try:
                client = self._connected()
                sent = True
                return self._exec(client, tuple(argv))
            except TransientRemoteError as exc:
                self.close()
                if sent and changes_state:
                    raise OutcomeUnknownError(
                        f"connection to {self.target} dropped while running {shlex.join(argv)!r}: "
                        f"{exc}. It may or may not have run; read the node's state before retrying"
                    ) from exc
                delay = next(delays, None)
                if delay is None:
                    raise TransientRemoteError(
                        f"{self.target}: still failing after {attempt} attempts: {exc}"
                    ) from exc
                self._sleep(delay)

    # -- internals -----------------------------------------------------------------------
    def _connected(self) -> paramiko.SSHClient:
        transport = self._client.get_transport() if self._client else None
        if self._client is not None and transport is not None and transport.is_active():
            return self._client
        self.close()
        s = self.settings
        key = self._load_key()
        client = paramiko.SSHClient()
        if not s.known_hosts.is_file():
            raise ConfigError(f"known_hosts file {s.known_hosts} does not exist; create it with the "
                              f"host key of {s.host}")
        client.load_host_keys(str(s.known_hosts))
        client.set_missing_host_key_policy(_RefuseUnknownHost())
        try:
            client.connect(
                s.host, port=s.port, username=s.username, pkey=key,
                look_for_keys=False, allow_agent=False, timeout=s.connect_timeout_s,
                banner_timeout=s.connect_timeout_s, auth_timeout=s.connect_timeout_s,
                channel_timeout=s.connect_timeout_s,
            )
        except Exception as exc:
            client.close()
            mapped = _translate(exc, self.target)
            if mapped is exc:
                raise
            raise mapped from exc
        self._client = client
        return client

    def _load_key(self) -> paramiko.PKey:
        s = self.settings
        secret = s.key_passphrase.get_secret_value() if s.key_passphrase else None
        try:
            return paramiko.PKey.from_path(s.key_path, password=secret)
        except FileNotFoundError as exc:
            raise ConfigError(f"SSH key {s.key_path} does not exist; set key_path in the SSH settings") from exc
        except (paramiko.SSHException, ValueError, OSError) as exc:
            raise ConfigError(f"SSH key {s.key_path} cannot be loaded: {exc}") from exc

    def _exec(self, client: paramiko.SSHClient, argv: tuple[str, ...]) -> CommandResult:
        command = shlex.join(argv)
        timeout = self.settings.command_timeout_s
        try:
            transport = client.get_transport()
            if transport is None or not transport.is_active():
                raise TransientRemoteError(f"connection to {self.target} is closed")
            channel = transport.open_session(timeout=self.settings.connect_timeout_s)
            try:
                channel.settimeout(timeout)
                channel.exec_command(command)
                stdout, stderr = self._collect(channel, transport, timeout)
                rc = channel.recv_exit_status()
            finally:
                channel.close()
        except Exception as exc:
            mapped = _translate(exc, self.target)
            if mapped is exc:
                raise
            raise mapped from exc
        if rc == -1:
            # paramiko reports -1 when the channel closed without an exit status: the
            # connection dropped (or the server killed the session) mid-command.
            raise TransientRemoteError(f"{self.target} closed the session before {command!r} reported an exit status")
        return CommandResult(argv=argv, rc=rc, stdout=stdout, stderr=stderr)

    def _collect(self, channel: paramiko.Channel, transport: paramiko.Transport, timeout: float) -> tuple[str, str]:
        """Read stdout and stderr until the command has exited *and* its output has ended.

        sshd may send the exit status before the last of the output: it reaps the process
        while the pipe still holds data. Stopping at the exit status alone cut a 10 kB
        ``scontrol show node`` to its first seven nodes under load, so the end of output (the
        channel's EOF) is waited for too, for at most ``_EOF_GRACE_S`` after the exit status: a
        child the command left in the background may hold the pipe open for ever, and the
        command itself has ended.
        """
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout
        exited_at: float | None = None
        while True:
            busy = False
            if channel.recv_ready():
                out += channel.recv(65536)
                busy = True
            if channel.recv_stderr_ready():
                err += channel.recv_stderr(65536)
                busy = True
            if busy:
                if time.monotonic() > deadline:
                    raise TransientRemoteError(f"{self.target}: command did not finish within {timeout:.0f} s")
                continue
            if channel.eof_received and channel.exit_status_ready():
                break
            if channel.closed or not transport.is_active():
                # A close with no EOF before it: the connection went mid-output.
                raise TransientRemoteError(f"connection to {self.target} dropped mid-command")
            now = time.monotonic()
            if channel.exit_status_ready():
                exited_at = exited_at or now
                if now - exited_at > _EOF_GRACE_S:
                    break
            if now > deadline:
                raise TransientRemoteError(f"{self.target}: command did not finish within {timeout:.0f} s")
            time.sleep(_POLL_S)
        while channel.recv_ready():  # what arrived between the last read and the EOF check
            out += channel.recv(65536)
        while channel.recv_stderr_ready():
            err += channel.recv_stderr(65536)
        return out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def _translate(exc: Exception, target: str) -> Exception:
    """Map paramiko/socket errors to ours, most specific first; others become RemoteError."""
    if isinstance(exc, RemoteError | ConfigError):
        return exc
    if isinstance(exc, paramiko.BadHostKeyException):
        return HostKeyError(
            f"host key of {target} does not match known_hosts (got {exc.key.get_name()} "
            f"{exc.key.get_fingerprint().hex()}); nothing was sent. This may be an attack or a "
            "reinstalled host: verify the new key out of band before updating known_hosts"
        )
    if isinstance(exc, paramiko.ssh_exception.IncompatiblePeer):
        return HostKeyError(
            f"{target} offers no host key or algorithm we accept ({exc}); nothing was sent. Check that "
            "known_hosts holds the server's current key type"
        )
    if isinstance(exc, paramiko.AuthenticationException):
        return RemoteAuthError(f"{target} refused our key: {exc}; check key_path and authorized_keys")
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError | socket.timeout | TimeoutError
                   | ConnectionError | EOFError | paramiko.SSHException | OSError):
        return TransientRemoteError(f"{target}: {type(exc).__name__}: {exc}")
    return RemoteError(f"{target}: unexpected {type(exc).__name__}: {exc}")
