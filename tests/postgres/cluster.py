"""A PostgreSQL cluster of the test's own, for tests that stop, kill or restart the server
(the shared one on 5432 is never touched): initdb as the postgres user in a temporary
directory, on a spare loopback port in 15440-15459, removed at the end."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

BIN = Path("/usr/lib/postgresql/15/bin")
PORTS = range(15440, 15460)


def _as_postgres(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    cmd = " ".join(f"'{a}'" for a in args)
    return subprocess.run(
        ["su", "postgres", "-c", cmd], capture_output=True, text=True, timeout=timeout
    )


def _free_port() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    start = int(worker[2:]) * 5 if worker[2:].isdigit() else 0
    for port in [*PORTS[start:], *PORTS[:start]]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 15440-15459")


class Cluster:
    """One throw-away PostgreSQL server: start, stop, kill -9, with fsync and
    synchronous_commit on (the defaults)."""

    def __init__(self) -> None:
        if not (BIN / "initdb").exists() or shutil.which("su") is None:
            pytest.skip("PostgreSQL 15 binaries are not installed here")
        self.dir = Path(tempfile.mkdtemp(prefix="fairq-pg-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        shutil.chown(self.dir, "postgres", "postgres")
        done = _as_postgres(
            str(BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"
        )
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed: {done.stderr}")
        conf = self.data / "postgresql.conf"
        with conf.open("a") as f:
            f.write(
                f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\n"
                f"unix_socket_directories = '{self.dir}'\nfsync = on\n"
                "synchronous_commit = on\nmax_connections = 50\nshared_buffers = 32MB\n"
            )
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        self._started = False

    def start(self) -> None:
        for _ in range(5):
            done = _as_postgres(
                str(BIN / "pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.dir / "log"),
                "-w",
                "-t",
                "60",
                "start",
            )
            if done.returncode == 0:
                self._started = True
                return
            log = (self.dir / "log").read_text(errors="replace").splitlines()[-15:]
            if self._started or not any("could not bind" in line for line in log):
                break
            # another process took the port between _free_port() and the bind (tests run
            # in parallel): the first start moves to another one
            self.port = _free_port()
            with (self.data / "postgresql.conf").open("a") as f:
                f.write(f"\nport = {self.port}\n")
            self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        raise RuntimeError(f"pg_ctl start failed: {done.stdout} {done.stderr}\n" + "\n".join(log))

    def stop(self) -> None:
        _as_postgres(str(BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def kill9(self) -> None:
        """kill -9 the postmaster and its children (a crash: no shutdown checkpoint).

        The postmaster is stopped (SIGSTOP) before its children are listed, so none can be
        forked after the list was taken (an autovacuum worker, a new backend) and outlive
        the crash: such an orphan would keep answering its client, and would keep the
        shared memory attached, so the next start would refuse to run."""
        pid = self.postmaster_pid()
        os.kill(pid, signal.SIGSTOP)
        children = [
            int(c)
            for c in subprocess.run(
                ["pgrep", "-P", str(pid)], capture_output=True, text=True
            ).stdout.split()
        ]
        for victim in [*children, pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 10
        for victim in [pid, *children]:
            while time.monotonic() < deadline:
                try:
                    os.kill(victim, 0)
                except ProcessLookupError:
                    break  # gone and reaped: a zombie would still hold the lock files
                time.sleep(0.02)
        with contextlib.suppress(FileNotFoundError):
            (self.data / "postmaster.pid").unlink()

    def remove(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()
        with contextlib.suppress(Exception):
            if (self.data / "postmaster.pid").exists():
                self.kill9()
        shutil.rmtree(self.dir, ignore_errors=True)
