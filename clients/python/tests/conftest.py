"""Starts a real ``tollgate serve`` for the tests: SQLite in a temporary folder, a free
127.0.0.1 port (``--addr 127.0.0.1:0``; the server prints the one it got), two apps with
keys (and a key of one of them bound to a subject), the built-in dev provider, and a tight
budget policy; webhooks may go to ``http://127.0.0.1`` (the ``receiver`` fixture)."""

from __future__ import annotations

import os
import queue
import re
import shutil
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]
ACME_KEY = "acme-key-py-0123456789abcdef"
BETA_KEY = "beta-key-py-0123456789abcdef"
#: An acme key bound to the subject ``user:alice``: sees only alice's tasks and runs.
ALICE_KEY = "acme-alice-key-py-0123456789abcdef"
#: Requests above this many stored bytes are refused with 413.
MAX_REQUEST_BYTES = 20000

CONFIG = """
[server]
max_request_bytes = {max_request_bytes}
max_wait = "20s"

[database]
url = "{database_url}"

[models.default]
provider = "dev"
model = "dev-1"

# Each call takes 30 s: for waits that time out and for cancellations.
[models.slow]
provider = "dev"
model = "dev-1"
params = {{ latency_ms = 30000 }}

[budgets.standard]
max_steps_per_source = 50
sources_per_24_hours = 1000
scope_concurrent = 50
burst = 100
tasks_per_minute = 6000

# One scoped task at once, then one a second.
[budgets.tight]
max_steps_per_source = 50
sources_per_24_hours = 1000
scope_concurrent = 50
burst = 1
tasks_per_minute = 60

[apps.acme]
api_keys = ["{acme}", {{ key = "{alice}", subject = "user:alice" }}]
default_budget = "standard"
allowed_budgets = ["standard", "tight"]

[apps.beta]
api_keys = ["{beta}"]
default_budget = "standard"
allowed_budgets = ["standard"]

[workers]
concurrency = 4
heartbeat_interval = "200ms"

[sweeper]
interval = "500ms"

[pipelines]
poll_interval = "200ms"

# The webhook tests' receivers listen on 127.0.0.1 over plain http.
[webhooks]
allow_http = true
allowed_networks = ["127.0.0.1/32"]
poll_interval = "200ms"
"""


def tollgate_bin() -> str:
    candidates = [
        os.environ.get("TOLLGATE_BIN"),
        os.path.join(os.environ["CARGO_TARGET_DIR"], "debug", "tollgate")
        if os.environ.get("CARGO_TARGET_DIR")
        else None,
        str(REPO_ROOT / "target" / "debug" / "tollgate"),
    ]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise RuntimeError(
        f"no tollgate binary (tried {candidates}): run cargo build -p tollgate or set TOLLGATE_BIN"
    )


@dataclass
class Server:
    base_url: str


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    folder = tempfile.mkdtemp(prefix="tollgate-py-")
    config = Path(folder) / "tollgate.toml"
    config.write_text(
        CONFIG.format(
            max_request_bytes=MAX_REQUEST_BYTES,
            database_url=f"sqlite://{folder}/tollgate.db",
            acme=ACME_KEY,
            alice=ALICE_KEY,
            beta=BETA_KEY,
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOLLGATE_") or k == "TOLLGATE_LOG"}
    child = subprocess.Popen(
        [tollgate_bin(), "serve", "--addr", "127.0.0.1:0", "--config", str(config)],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    base_url = None
    try:
        while base_url is None:
            line = lines.get(timeout=60)
            match = re.match(r"Tollgate listening on (\S+)", line)
            if match:
                base_url = match.group(1)
        yield Server(base_url)
    finally:
        child.kill()
        child.wait()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes


class Receiver:
    """A webhook receiver on 127.0.0.1: answers 200 and keeps each request's headers and raw
    body."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with receiver._lock:
                    receiver.received.append(
                        Received({k.lower(): v for k, v in self.headers.items()}, body)
                    )
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}/hook"
        threading.Thread(target=self._http.serve_forever, daemon=True).start()

    def of_event(self, event_id: str) -> list[Received]:
        with self._lock:
            return [r for r in self.received if r.headers.get("webhook-id") == event_id]

    def wait_for(self, event_id: str, count: int, timeout: float = 10.0) -> list[Received]:
        """The requests carrying ``event_id`` once there are ``count`` of them (blocking)."""
        deadline = time.monotonic() + timeout
        while len(found := self.of_event(event_id)) < count:
            assert time.monotonic() < deadline, f"{len(found)} of {count} requests of {event_id}"
            time.sleep(0.05)
        return found

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()
