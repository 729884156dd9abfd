"""Issue 15 against a real ``fairq serve`` subprocess on a free loopback port: each test
replays one defect an outside review found, as an attacker would send it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from fairq.http.auth import COOKIE
from fairq.http.nesting import MAX_DEPTH
from subprocs import free_port


@dataclass
class Served:
    """A running ``fairq serve``: its URL, and its output so far (stdout and stderr)."""

    url: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text()


@contextlib.contextmanager
def serve(cwd: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[Served]:
    """``fairq serve`` on SQLite in ``cwd``, its output in a file (a pipe nobody reads
    could fill up and stall the server)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = cwd / f"serve-{port}.log"
    cmd = [sys.executable, "-m", "fairq", "serve", "--port", str(port), *args]
    full_env = {
        **os.environ,
        "FAIRQ_URL": f"sqlite:///{cwd / 'serve.db'}",
        "FAIRQ_API_KEYS": "",
        **(env or {}),
    }
    with log_path.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=full_env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"fairq serve did not start: {log_path.read_text()}")
            time.sleep(0.05)
        yield Served(url, log_path)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``fairq serve`` without API keys (the default: open, on loopback)."""
    with serve(tmp_path_factory.mktemp("open")) as served:
        yield served


@pytest.fixture
def url(open_server: Served) -> str:
    return open_server.url


def no_traceback(served: Served) -> None:
    log = served.log()
    assert "Traceback" not in log, log[-3000:]


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# -- defect 3: deep nesting ------------------------------------------------------------------
def test_deeply_nested_json_is_a_400_not_a_500(open_server: Served) -> None:
    url = open_server.url
    assert httpx.put(f"{url}/v1/queues/deep").status_code == 200
    # ~1.2 KB of brackets in a message body: msgspec's RecursionError was a 500
    r = httpx.post(
        f"{url}/v1/queues/deep/messages",
        content='{"messages": [{"body": ' + nested(1000) + "}]}",
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "bad_request" and str(MAX_DEPTH) in r.json()["detail"]
    # ~500 levels outside a body: the whole-number fallback recursed into a 500
    r = httpx.put(
        f"{url}/v1/queues/deep",
        content='{"max_attempts": 5.0, "dead_letter": ' + nested(600) + "}",
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 400, r.text
    # a filter in the query string, as deep
    assert httpx.put(f"{url}/v1/topics/t").status_code == 200
    r = httpx.get(f"{url}/v1/topics/t/stream", params={"filter": '{"a": ' + nested(3000) + "}"})
    assert r.status_code == 400, r.text
    no_traceback(open_server)


def test_nesting_up_to_the_bound_still_works(url: str) -> None:
    assert httpx.put(f"{url}/v1/queues/nest").status_code == 200
    body = nested(MAX_DEPTH - 3)  # {"messages": [{"body": ...}]} adds three levels
    r = httpx.post(
        f"{url}/v1/queues/nest/messages",
        content='{"messages": [{"body": ' + body + "}]}",
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 200, r.text
    got = httpx.post(f"{url}/v1/queues/nest/receive", json={}).json()["messages"]
    assert got[0]["body"] == body


# -- defect 4: cross-site simple requests ----------------------------------------------------
EVIL = "https://evil.example"


def visible(url: str, queue: str) -> int:
    n: int = httpx.get(f"{url}/v1/queues/{queue}").json()["stats"]["visible"]
    return n


def test_cross_site_simple_requests_change_nothing(url: str) -> None:
    assert httpx.put(f"{url}/v1/queues/victim").status_code == 200
    send = '{"messages": [{"body": "x"}]}'
    assert httpx.post(f"{url}/v1/queues/victim/messages", content=send).status_code == 200
    for headers in (
        {"Origin": EVIL, "Content-Type": "text/plain"},  # the curl
        {"Origin": "null", "Content-Type": "application/x-www-form-urlencoded"},
        {"Sec-Fetch-Site": "cross-site", "Content-Type": "multipart/form-data; boundary=x"},
        {"Sec-Fetch-Site": "same-site", "Origin": "http://other.localhost"},  # no body
    ):
        r = httpx.post(f"{url}/v1/queues/victim/purge", headers=headers)
        assert r.status_code == 403, (headers, r.text)
        assert r.json()["error"] == "cross_site_request"
        r = httpx.post(f"{url}/v1/queues/victim/messages", content=send, headers=headers)
        assert r.status_code == 403, headers
        r = httpx.post(f"{url}/v1/queues/victim/receive", content="{}", headers=headers)
        assert r.status_code == 403, headers
    assert visible(url, "victim") == 1, "nothing was purged, sent or leased"
    # what a browser can only send after a CORS preflight (never granted) is not refused,
    # nor the dashboard's same-origin calls, nor scripts (no Origin at all)
    r = httpx.post(
        f"{url}/v1/queues/victim/messages",
        content=send,
        headers={"Origin": EVIL, "Content-Type": "application/json"},
    )
    assert r.status_code == 200
    same = {"Origin": url, "Sec-Fetch-Site": "same-origin", "X-Fairq-Dashboard": "1"}
    r = httpx.post(f"{url}/v1/queues/victim.dlq/redrive", json={}, headers=same)
    assert r.status_code == 200
    assert httpx.post(f"{url}/v1/queues/victim/purge", headers={"Origin": url}).status_code == 200
    assert visible(url, "victim") == 0


# -- defect 5: DNS rebinding -----------------------------------------------------------------
def test_an_open_server_answers_only_to_loopback_host_names(url: str) -> None:
    port = url.rsplit(":", 1)[1]
    for host in (f"attacker.example:{port}", "attacker.example", f"127.0.0.1.nip.io:{port}"):
        r = httpx.get(f"{url}/v1/queues", headers={"Host": host})
        assert r.status_code == 400, host
        assert r.json()["error"] == "host_not_allowed"
        r = httpx.delete(f"{url}/v1/queues/victim", headers={"Host": host})
        assert r.status_code == 400
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", "localhost"):
        assert httpx.get(f"{url}/v1/queues", headers={"Host": host}).status_code == 200, host


def test_allowed_hosts_add_names(tmp_path: Path) -> None:
    env = {"FAIRQ_ALLOWED_HOSTS": "queue.internal, other.internal:9000"}
    with serve(tmp_path, "--allowed-host", "fairq.lan", env=env) as served:
        get = served.url + "/v1/queues"
        for host, status in (
            ("fairq.lan:1234", 200),
            ("queue.internal", 200),
            ("other.internal:9000", 200),
            ("other.internal:9001", 400),
            ("attacker.example", 400),
        ):
            assert httpx.get(get, headers={"Host": host}).status_code == status, host


ADMIN = "admin-key-0123456789abcdef"
SENDER = "send-key-0123456789abcdef"


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``fairq serve`` with an admin key and a send key."""
    keys = f"{ADMIN}:admin,{SENDER}:send"
    with serve(tmp_path_factory.mktemp("keyed"), env={"FAIRQ_API_KEYS": keys}) as served:
        yield served


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_server_with_keys_refuses_cross_site_forms_too(keyed_server: Served) -> None:
    url = keyed_server.url
    # login CSRF: a page logging the victim's browser in with the attacker's key
    r = httpx.post(
        f"{url}/login",
        content=f"key={ADMIN}",
        headers={"Origin": EVIL, "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 403 and "set-cookie" not in r.headers
    r = httpx.put(f"{url}/v1/queues/k", headers={**bearer(ADMIN), "Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403
    # with keys, any Host name is answered (the key is what protects it)
    r = httpx.get(f"{url}/v1/queues", headers={**bearer(ADMIN), "Host": "fairq.example.com"})
    assert r.status_code == 200


# -- defect 8: work queue templates ----------------------------------------------------------
def test_work_queue_templates_take_plain_fields_only(url: str) -> None:
    for template in (
        "{key}{key:x>200000000000000}",  # was a MemoryError: 500
        "{key}{key:x>100000000}",  # allocated 100 MB before the name check refused it
        "{key!r}",
        "{key.__class__}",
        "{0}{key}",
        "{key",
        "process.{tenant}.{key}",
    ):
        r = httpx.put(f"{url}/v1/attention/market", json={"work_queue": template}, timeout=10)
        assert r.status_code == 422, (template, r.text)
        assert r.json()["error"] == "invalid_option"
    # the longest key must fit: 200 characters at most
    long_domain = "d" * 120
    r = httpx.put(f"{url}/v1/attention/{long_domain}", json={})
    assert r.status_code == 422 and "200" in r.json()["detail"], r.text
    r = httpx.put(f"{url}/v1/attention/market", json={"work_queue": "w.{domain}.{key}"})
    assert r.status_code == 200, r.text
    key = "k" * 100
    r = httpx.post(
        f"{url}/v1/attention/market/keys/{key}/messages", json={"messages": [{"body": 1}]}
    )
    assert r.status_code == 200, r.text


# -- defect 9: the dashboard's login cookie --------------------------------------------------
OTHER_ADMIN = "other-admin-key-0123456789"
SAME = {"Sec-Fetch-Site": "same-origin"}  # what the login page's own form sends


def log_in(url: str, key: str) -> str:
    """The value of the cookie ``POST /login`` sets for ``key``."""
    r = httpx.post(
        f"{url}/login",
        content=f"key={key}",
        headers={**SAME, "Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 303 and r.headers["location"] == "/", r.text
    (name, value), *_ = r.cookies.items()
    assert name == COOKIE, name
    return value


def with_cookie(url: str, cookie: str, path: str = "/v1/overview") -> int:
    return httpx.get(url + path, cookies={COOKIE: cookie}).status_code


def test_the_login_cookie_is_a_signed_session_not_the_key(tmp_path: Path) -> None:
    keys = {"FAIRQ_API_KEYS": f"{ADMIN}:admin,{OTHER_ADMIN}:admin,{SENDER}:send"}
    secret = {"FAIRQ_SESSION_SECRET": "a-session-secret-for-the-test-0123456789"}
    with serve(tmp_path, env={**keys, **secret}) as served:
        url = served.url
        cookie = log_in(url, ADMIN)
        assert ADMIN not in cookie, "the cookie is the raw admin key"
        assert with_cookie(url, cookie) == 200 and with_cookie(url, cookie, "/") == 200
        # the key itself in the cookie is no session (a cookie stolen before this release)
        assert with_cookie(url, ADMIN) == 401
        # altered or forged sessions are refused
        payload, _, mac = cookie.rpartition(".")
        assert with_cookie(url, payload + "." + mac[::-1]) == 401
        expires = payload.split(".")[2]
        assert with_cookie(url, cookie.replace(expires, str(int(expires) + 10**6))) == 401
        # logout revokes the session on the server, not only in the browser
        second = log_in(url, OTHER_ADMIN)
        r = httpx.post(f"{url}/logout", cookies={COOKIE: second}, headers=SAME)
        assert r.status_code == 303
        assert with_cookie(url, second) == 401
        assert with_cookie(url, cookie) == 200
    # the same secret after a restart: the session lives on...
    with serve(tmp_path, env={**keys, **secret}) as served:
        assert with_cookie(served.url, cookie) == 200
    # ...until its key is removed from FAIRQ_API_KEYS
    fewer = {"FAIRQ_API_KEYS": f"{OTHER_ADMIN}:admin,{SENDER}:send"}
    with serve(tmp_path, env={**fewer, **secret}) as served:
        assert with_cookie(served.url, cookie) == 401
        assert with_cookie(served.url, cookie, "/") == 303, "back to the login page"


def test_sessions_expire(tmp_path: Path) -> None:
    # a ttl of 4 s: on a loaded machine the login and the first request took over a second
    with serve(tmp_path, "--session-ttl", "4", env={"FAIRQ_API_KEYS": f"{ADMIN}:admin"}) as served:
        logged_in = time.monotonic()
        cookie = log_in(served.url, ADMIN)
        assert with_cookie(served.url, cookie) == 200
        # the cookie's expiry has one-second resolution
        time.sleep(max(0.0, logged_in + 5.1 - time.monotonic()))
        assert with_cookie(served.url, cookie) == 401


# -- defect 10: the small ones ---------------------------------------------------------------
def test_healthz_shows_the_backend_kind_to_anonymous_callers(keyed_server: Served) -> None:
    url = keyed_server.url
    r = httpx.get(f"{url}/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok", "backend": "sqlite"}
    r = httpx.get(f"{url}/healthz", headers=bearer("wrong-key-0123456789abcdef"))
    assert r.json()["backend"] == "sqlite"
    r = httpx.get(f"{url}/healthz", headers=bearer(SENDER))
    assert r.json()["backend"].startswith("sqlite:///") and "serve.db" in r.json()["backend"]


SEEDED = """\
# what an attacker who has recovered a Mersenne Twister's state knows (624 outputs of it
# suffice): every random.Random made in this process starts from seed 1234
import random

_init = random.Random.__init__


def _known_state(self, x=None):
    _init(self, 1234)


random.Random.__init__ = _known_state
"""


def test_lease_receipts_do_not_come_from_a_predictable_generator(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SEEDED)
    known = random.Random(1234)
    predicted = [f"{known.getrandbits(62) | 1:x}" for _ in range(3)]
    env = {"PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with serve(tmp_path, env=env) as served:
        url = served.url
        assert httpx.put(f"{url}/v1/queues/jobs").status_code == 200
        sent = httpx.post(
            f"{url}/v1/queues/jobs/messages", json={"messages": [{"body": i} for i in range(3)]}
        )
        assert sent.status_code == 200
        leases = []
        for _ in range(3):
            got = httpx.post(f"{url}/v1/queues/jobs/receive", json={}).json()["messages"]
            leases.append(got[0]["receipt"].split(".")[1])
    assert len(set(leases)) == 3
    assert not set(leases) & set(predicted), "the receipts were predicted"


def test_tickets_have_one_spelling(tmp_path: Path) -> None:
    import fairq

    with fairq.connect_sync(f"sqlite:///{tmp_path / 'serve.db'}") as broker:
        broker.waiting_room("ev-88", admit_rate=1.0)
    with serve(tmp_path) as served:
        url = served.url
        r = httpx.post(f"{url}/rooms/ev-88/join", headers={"Accept": "application/json"})
        assert r.status_code == 200, r.text
        ticket = r.json()["ticket"]
        seq, rest = ticket.split(".", 1)
        assert seq == "1"
        status = f"{url}/rooms/ev-88/status"
        assert httpx.get(status, params={"ticket": ticket}).status_code == 200
        for spelling in ("0x1", "0X1", "+1", "0001", " 1", "1 ", "01"):
            r = httpx.get(status, params={"ticket": f"{spelling}.{rest}"})
            assert r.status_code == 400, spelling
            assert r.json()["error"] == "invalid_ticket"


async def test_waiting_requests_are_capped_per_server(tmp_path: Path) -> None:
    with serve(tmp_path, "--max-waiting", "3") as served:
        async with httpx.AsyncClient(base_url=served.url, timeout=30) as http:
            assert (await http.put("/v1/queues/idle")).status_code == 200
            assert (await http.put("/v1/topics/news")).status_code == 200
            poll = {"wait": 20}
            polls = [
                asyncio.create_task(http.post("/v1/queues/idle/receive", json=poll))
                for _ in range(3)
            ]
            await asyncio.sleep(0.5)  # the three are waiting
            started = time.monotonic()
            r = await http.post("/v1/queues/idle/receive", json=poll)
            assert r.status_code == 503, r.text
            assert r.json()["error"] == "server_busy" and r.headers["retry-after"] == "1"
            assert time.monotonic() - started < 5, "refused at once, not after waiting"
            async with http.stream("GET", "/v1/topics/news/stream") as stream:
                assert stream.status_code == 503
            # what does not wait is never refused
            r = await http.post("/v1/queues/idle/receive", json={"wait": 0})
            assert r.status_code == 200
            sent = await http.post(
                "/v1/queues/idle/messages", json={"messages": [{"body": i} for i in range(3)]}
            )
            assert sent.status_code == 200
            answers = await asyncio.gather(*polls)
            assert [len(a.json()["messages"]) for a in answers] == [1, 1, 1]
            # the slots are free again; a stream holds one for as long as it lasts
            streams = []
            for _ in range(3):
                s = http.stream("GET", "/v1/topics/news/stream")
                streams.append(s)
                assert (await s.__aenter__()).status_code == 200
            r = await http.post("/v1/queues/idle/receive", json={"wait": 1})
            assert r.status_code == 503
            await streams.pop().__aexit__(None, None, None)
            for _ in range(50):  # the server notices the client left
                r = await http.post("/v1/queues/idle/receive", json={"wait": 0.1})
                if r.status_code == 200:
                    break
                await asyncio.sleep(0.1)
            assert r.status_code == 200
            for s in streams:
                await s.__aexit__(None, None, None)
        no_traceback(served)


async def client_queues(url: str) -> list[str]:
    from fairq.http import Client

    async with Client(url) as client:
        return await client.list_queues()


def test_the_queue_list_comes_in_pages(tmp_path: Path) -> None:
    import fairq

    with fairq.connect_sync(f"sqlite:///{tmp_path / 'serve.db'}") as broker:
        for i in range(250):
            broker.declare_queue(f"q{i:04d}", dead_letter=None)
    with serve(tmp_path) as served:
        url = served.url
        first = httpx.get(f"{url}/v1/queues").json()
        assert len(first["queues"]) == 100, "one page by default, not every queue"
        names = [q["name"] for q in first["queues"]]
        cursor = first["next_cursor"]
        while cursor:
            page = httpx.get(f"{url}/v1/queues", params={"cursor": cursor, "limit": 70}).json()
            assert len(page["queues"]) <= 70
            names += [q["name"] for q in page["queues"]]
            cursor = page["next_cursor"]
        assert names == [f"q{i:04d}" for i in range(250)]
        whole = httpx.get(f"{url}/v1/queues", params={"limit": 1000}).json()
        assert len(whole["queues"]) == 250 and whole["next_cursor"] is None
        assert httpx.get(f"{url}/v1/queues", params={"limit": 1001}).status_code == 422
        some = httpx.get(f"{url}/v1/queues", params={"prefix": "q01", "limit": 5}).json()
        assert [q["name"] for q in some["queues"]] == [f"q{i:04d}" for i in range(100, 105)]
        # fairq.http.Client (and the CLI's --server) follow the pages
        assert len(asyncio.run(client_queues(url))) == 250


def test_rooms_made_with_a_secret_are_served_with_fairq_room_secrets(tmp_path: Path) -> None:
    import base64

    import fairq

    secret = os.urandom(32)
    with fairq.connect_sync(f"sqlite:///{tmp_path / 'serve.db'}") as broker:
        broker.waiting_room("ev-88", admit_rate=1000.0, secret=secret)
        broker.waiting_room("ev-99", admit_rate=1000.0)  # its key kept in the backend
    json_ = {"Accept": "application/json"}
    with serve(tmp_path) as served:
        for r in (
            httpx.post(f"{served.url}/rooms/ev-88/join", headers=json_),
            httpx.get(f"{served.url}/rooms/ev-88"),
        ):
            assert r.status_code == 503, r.text
            assert r.json()["error"] == "room_secret_missing"
            assert "FAIRQ_ROOM_SECRETS" in r.json()["detail"], "the error says what to do"
        assert httpx.post(f"{served.url}/rooms/ev-99/join", headers=json_).status_code == 200
        assert "Traceback" not in served.log()
    wrong = {"FAIRQ_ROOM_SECRETS": f"ev-88={os.urandom(32).hex()}"}
    with serve(tmp_path, env=wrong) as served:
        r = httpx.get(f"{served.url}/rooms/ev-88")
        assert r.status_code == 503 and "another secret" in r.json()["detail"]
    for given in (f"ev-88={base64.urlsafe_b64encode(secret).decode()}", f"*={secret.hex()}"):
        with serve(tmp_path, env={"FAIRQ_ROOM_SECRETS": given}) as served:
            r = httpx.post(f"{served.url}/rooms/ev-88/join", headers=json_)
            assert r.status_code == 200, (given, r.text)
            assert httpx.get(f"{served.url}/rooms/ev-88").status_code == 200
            # a room without a secret is still served beside "*"
            assert httpx.get(f"{served.url}/rooms/ev-99").status_code == 200


def test_fairq_room_secrets_are_checked_at_start(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "fairq", "serve", "--port", str(free_port())],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,  # a server that starts anyway is stopped by this (and fails the test)
        env={**os.environ, "FAIRQ_API_KEYS": "", "FAIRQ_ROOM_SECRETS": "ev-88:hunter2hunter2"},
    )
    assert out.returncode == 2
    assert "FAIRQ_ROOM_SECRETS" in out.stderr and "hunter2" not in out.stderr
