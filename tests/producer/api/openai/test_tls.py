"""`tidegate api --ssl-certfile F --ssl-keyfile F` serves HTTPS: the real `openai` package streams a
chat completion through it, trusting only the test's own CA, made at test time."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from redis import Redis

from ops.lab.procs.ports import free_port
from ops.lab.sim.process import SimulatorProcess
from producer.api.keys import ApiKeyStore, Role
from shared.keys import QueueKeys
from tests.tls_certs import TlsFiles, make_tls_files
from tests.waiting import wait_until

START_TIMEOUT_S = 30.0
MESSAGES: list[Any] = [{"role": "user", "content": "Is my loan application complete?"}]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "from tidegate.cli import main; main()", *args]


def _trusting(files: TlsFiles) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(files.ca))


@pytest.fixture
def tls_files(tmp_path: Path) -> TlsFiles:
    return make_tls_files(tmp_path)


@pytest.fixture
def https_api(redis_url: str, queue_name: str, fast_policy_file: Path, tls_files: TlsFiles) -> Iterator[str]:
    port = free_port()
    env = {
        **os.environ,
        "TIDEGATE_REDIS_URL": redis_url,
        "TIDEGATE_QUEUE_NAME": queue_name,
        "TIDEGATE_POLICY_FILE": str(fast_policy_file),
    }
    command = _cli("api", "--port", str(port), "--log-level", "warning", "--no-access-log")
    command += ["--ssl-certfile", str(tls_files.cert), "--ssl-keyfile", str(tls_files.key)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base_url = f"https://127.0.0.1:{port}"
    try:

        def answering() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"`tidegate api` over TLS exited: {process.communicate()[1]}")
            return httpx.get(base_url + "/livez", verify=_trusting(tls_files), timeout=2).status_code == 200

        wait_until(
            answering, START_TIMEOUT_S, "`tidegate api` to answer over TLS", ignoring=(httpx.TransportError,)
        )
        yield base_url
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_openai_streams_a_chat_completion_over_https(
    https_api: str,
    tls_files: TlsFiles,
    redis_client: Redis,
    queue_name: str,
    backend: SimulatorProcess,
) -> None:
    key, _ = ApiKeyStore(redis_client, QueueKeys(queue_name)).create(
        Role.BRANCH, "0412", "tls test", default_type="complaint"
    )
    with httpx.Client(verify=_trusting(tls_files), timeout=30) as http:
        client = openai.OpenAI(base_url=https_api + "/v1", api_key=key, http_client=http, max_retries=0)
        stream = client.chat.completions.create(
            model="tidegate", messages=MESSAGES, max_tokens=8, stream=True
        )
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")

    # Without the CA the client refuses the server; plain HTTP on the TLS port gets no answer.
    with httpx.Client(timeout=5) as http:
        untrusting = openai.OpenAI(base_url=https_api + "/v1", api_key=key, http_client=http, max_retries=0)
        with pytest.raises(openai.APIConnectionError):
            untrusting.models.list()
    with pytest.raises(httpx.TransportError):
        httpx.get(https_api.replace("https://", "http://") + "/livez", timeout=5)


def test_a_missing_certificate_file_exits_2_naming_the_flag(tmp_path: Path, tls_files: TlsFiles) -> None:
    result = subprocess.run(
        _cli("api", "--ssl-certfile", str(tmp_path / "nope.pem"), "--ssl-keyfile", str(tls_files.key)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--ssl-certfile" in result.stderr and "nope.pem" in result.stderr
    result = subprocess.run(
        _cli("api", "--ssl-certfile", str(tls_files.cert)), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "ssl_certfile" in result.stderr
