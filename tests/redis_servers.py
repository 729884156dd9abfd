"""Private redis-server processes for the tests that kill, restart or reconfigure Redis,
or need a Cluster: Debian's ``/usr/bin/redis-server`` on loopback ports 16400-16499 (this
suite's range), each with its own ``--dir`` in a temporary directory. The shared Redis on
6379 is never touched by these.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PORTS = range(16400, 16500)
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


def service_up(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def commandstats(port: int) -> dict[str, int]:
    """``INFO commandstats`` of the redis-server on ``port``: calls per command so far."""
    import redis

    r = redis.Redis(port=port)
    try:
        return {k: int(v["calls"]) for k, v in r.info("commandstats").items()}
    finally:
        r.close()


def available() -> bool:
    return os.path.exists(REDIS_SERVER) and os.path.exists(REDIS_CLI)


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _worker_slot() -> int:
    """pytest-xdist workers take disjoint slices of the range."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(name[2:]) if name[2:].isdigit() else 0


def free_ports(n: int) -> list[int]:
    """``n`` consecutive free ports of this worker's slice of the range."""
    width = 20
    start = PORTS.start + (_worker_slot() * width) % len(PORTS)
    candidates = [p for p in range(start, start + width) if p in PORTS]
    for i in range(len(candidates) - n + 1):
        block = candidates[i : i + n]
        if all(_free(p) for p in block):
            return block
    raise RuntimeError("no free ports left in 16400-16499")


class RedisServer:
    """One redis-server on 127.0.0.1:``port`` with data in ``workdir``."""

    def __init__(self, workdir: Path, port: int | None = None, *extra: str) -> None:
        self.port = port if port is not None else free_ports(1)[0]
        self.dir = workdir / f"redis-{self.port}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.extra = list(extra)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = [
            REDIS_SERVER,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--save",
            "",
            "--logfile",
            str(self.dir / "redis.log"),
            "--daemonize",
            "no",
            *self.extra,
        ]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.ping():
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        log = self.log()
        self.kill()  # never leave a half-started server behind
        raise RuntimeError(f"redis-server on {self.port} did not start: {log}")

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                s.sendall(b"PING\r\n")
                reply = s.recv(16)  # +PONG, or -NOAUTH from a server with a password
                return reply.startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False

    def log(self) -> str:
        path = self.dir / "redis.log"
        return path.read_text()[-2000:] if path.exists() else ""

    def kill(self) -> None:
        """kill -9: no shutdown, no final fsync."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


class RedisCluster:
    """Three masters on consecutive free ports, joined with ``redis-cli --cluster create``."""

    def __init__(self, workdir: Path, masters: int = 3, ports: list[int] | None = None) -> None:
        ports = ports or free_ports(masters)
        self.nodes = [
            RedisServer(
                workdir,
                p,
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                f"nodes-{p}.conf",
                "--cluster-node-timeout",
                "2000",
                "--appendonly",
                "no",
            )
            for p in ports
        ]

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def start(self) -> RedisCluster:
        for n in self.nodes:
            n.start()
        subprocess.run(
            [
                REDIS_CLI,
                "--cluster",
                "create",
                *(f"127.0.0.1:{n.port}" for n in self.nodes),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            out = subprocess.run(
                [REDIS_CLI, "-p", str(self.nodes[0].port), "cluster", "info"],
                capture_output=True,
                text=True,
            ).stdout
            if "cluster_state:ok" in out:
                return self
            time.sleep(0.1)
        raise RuntimeError("the test cluster did not become ready")

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


def drop_prefix(url: str) -> int:
    """Delete every key under the test URL's prefix (Redis, every node of a Cluster);
    return how many there were."""
    from urllib.parse import parse_qsl, urlsplit

    import redis
    from redis.cluster import RedisCluster

    parts = urlsplit(url)
    prefix = dict(parse_qsl(parts.query)).get("prefix")
    if not prefix or not prefix.startswith("t-"):
        return 0
    host, port = parts.hostname or "127.0.0.1", parts.port or 6379
    if parts.scheme == "redis+cluster":
        cluster = RedisCluster(host=host, port=port)
        try:
            nodes = [(n.host, n.port) for n in cluster.get_primaries()]
        finally:
            cluster.close()
    else:
        nodes = [(host, port)]
    n = 0
    for h, p in nodes:
        client = redis.Redis(host=h, port=p)
        try:
            keys = list(client.scan_iter(match=prefix + "*", count=1000))
            with client.pipeline(transaction=False) as pipe:
                for key in keys:  # one by one: on a Cluster node they are in many slots
                    pipe.unlink(key)
                pipe.execute()
            n += len(keys)
        finally:
            client.close()
    return n


_SESSION_CLUSTER: RedisCluster | None = None


def session_cluster() -> str:
    """The URL of this test process's 3-master Cluster, started on first use (so fixtures
    and hypothesis machines share it) and stopped when the process exits."""
    global _SESSION_CLUSTER
    if _SESSION_CLUSTER is None:
        import atexit
        import tempfile

        cluster = RedisCluster(Path(tempfile.mkdtemp(prefix="fairq-cluster-"))).start()
        atexit.register(cluster.stop)
        _SESSION_CLUSTER = cluster
    return _SESSION_CLUSTER.url
