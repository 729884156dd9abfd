"""A RabbitMQ node of the test's own, for tests that must restart or kill a broker.

The shared broker (5672) is never stopped or reconfigured: this node has its own name,
ports (25690/25691, inside the range this suite may use), data and log folders in a
temporary directory, its own Erlang cookie and no plugins. Debian's
``/usr/lib/rabbitmq/bin`` scripts start it directly (the ``/usr/sbin`` wrappers would
switch to the rabbitmq user and the shared node's environment file).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

BIN = Path("/usr/lib/rabbitmq/bin")
PORT, DIST_PORT = 25690, 25691
HOP_RETRY_MS = 5000  # rabbit dead_letter_worker_publisher_confirm_timeout (see below)


def available() -> bool:
    return (BIN / "rabbitmq-server").exists() and shutil.which("erl") is not None


class RabbitNode:
    """Start, kill -9 and restart one private node; ``url`` reaches its default vhost."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.name = f"fairq-test-{os.getpid()}@localhost"
        base.mkdir(parents=True, exist_ok=True)
        cookie = base / ".erlang.cookie"
        cookie.write_text(f"FAIRQTEST{os.getpid()}")
        cookie.chmod(0o400)
        (base / "rabbitmq.conf").write_text(f"listeners.tcp.local = 127.0.0.1:{PORT}\n")
        (base / "enabled_plugins").write_text("[].\n")
        (base / "none.conf").write_text("")
        self.env = dict(
            os.environ,
            HOME=str(base),
            RABBITMQ_NODENAME=self.name,
            RABBITMQ_NODE_PORT=str(PORT),
            RABBITMQ_DIST_PORT=str(DIST_PORT),
            RABBITMQ_MNESIA_BASE=str(base / "mnesia"),
            RABBITMQ_LOG_BASE=str(base / "log"),
            ERL_CRASH_DUMP=str(base / "erl_crash.dump"),  # not the checkout's root
            RABBITMQ_CONFIG_FILE=str(base / "rabbitmq.conf"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(base / "enabled_plugins"),
            RABBITMQ_CONF_ENV_FILE=str(base / "none.conf"),
            RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1} "
            # a hop of the durable delay wheel that the next queue did not confirm (it was
            # still starting after a kill -9) is sent again after this many ms: 180,000 by
            # default, longer than a test waits; docs/backends.md says so for operators
            f"-rabbit dead_letter_worker_publisher_confirm_timeout {HOP_RETRY_MS}",
        )
        self.url_base = f"amqp://guest:guest@127.0.0.1:{PORT}/"

    def _ctl(self, *args: str, timeout: float = 90) -> str:
        out = subprocess.run(
            [str(BIN / "rabbitmqctl"), "-n", self.name, *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        return out.stdout

    def start(self) -> None:
        subprocess.run(
            [str(BIN / "rabbitmq-server"), "-detached"], env=self.env, check=True, timeout=60
        )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if "fully booted and running" in self._ctl("await_startup", "--timeout", "5") or (
                self._ctl("status").find("RabbitMQ version") >= 0
            ):
                return
            time.sleep(0.5)
        raise RuntimeError(f"RabbitMQ node {self.name} did not start: see {self.base / 'log'}")

    def pid(self) -> int:
        return int(self._ctl("eval", "list_to_integer(os:getpid()).").strip())

    def kill(self) -> None:
        """kill -9: no clean shutdown, whatever was not on disk is gone."""
        pid = self.pid()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)

    def stop(self) -> None:
        try:
            self._ctl("stop", timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()
