"""`tidegate api` keeps an idle connection open longer than the clients' pools keep theirs.

httpx (and so the `openai` package) reuses a connection idle for up to 5 s, uvicorn's own default:
a server closing at the same moment failed such requests with "Server disconnected without sending
a response", though it never read them. Here one connection is reused after 6 s of silence.
"""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ops.lab.procs.ports import free_port, http_ok
from tests.redis_cluster import suite_env
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[3]
IDLE_SECONDS = 6.0
"""Past the 5 s both httpx and uvicorn default to."""


@pytest.mark.timeout(60)
def test_a_connection_idle_past_the_clients_pool_expiry_is_still_open(
    redis_url: str, queue_name: str, tmp_path: Path
) -> None:
    port = free_port()
    env = {**os.environ, **suite_env(redis_url), "TIDEGATE_QUEUE_NAME": queue_name}
    log = tmp_path / "api.log"
    with log.open("w") as sink:
        api = subprocess.Popen(
            [sys.executable, "-c", "from tidegate.cli import main; main()", "api", "--port", str(port)],
            cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:

            def answers() -> bool:
                assert api.poll() is None, log.read_text()
                return http_ok(f"http://127.0.0.1:{port}/livez")

            wait_until(answers, 20, "the API to answer /livez", interval=0.1)
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            connection.request("GET", "/livez")
            first = connection.getresponse()
            first.read()
            assert first.status == 200 and first.getheader("connection") != "close"
            local = connection.sock.getsockname() if connection.sock else None
            time.sleep(IDLE_SECONDS)  # the server process's idle timeout must really pass
            connection.request("GET", "/livez")  # on the same socket: a closed one fails here
            second = connection.getresponse()
            second.read()
            assert second.status == 200
            assert connection.sock is not None and connection.sock.getsockname() == local
            connection.close()
        finally:
            api.send_signal(signal.SIGINT)
            api.wait(timeout=20)
