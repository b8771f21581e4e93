"""Redis over TLS: a `rediss://` URL and the CA file (`TIDEGATE_REDIS_SSL_CA_CERTS`) reach every
client, which keeps its connect and read timeouts; a server the CA did not sign is refused."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from pydantic import ValidationError

from shared.config import Settings
from shared.redis_conn import (
    CONNECT_TIMEOUT_SECONDS,
    READ_TIMEOUT_SECONDS,
    blocking_client,
    connect_async_from,
    connect_from,
    make_client,
)
from tests.private_redis import private_redis
from tests.tls_certs import TlsFiles, make_tls_files


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory, tls_files: TlsFiles) -> Iterator[str]:
    with private_redis(tmp_path_factory.mktemp("redis"), tls=tls_files) as url:
        assert url.startswith("rediss://")
        yield url


def test_every_client_verifies_the_server_with_the_ca_and_keeps_its_timeouts(
    tls_redis: str, tls_files: TlsFiles
) -> None:
    settings = Settings(redis_url=tls_redis, redis_ssl_ca_certs=str(tls_files.ca))
    client = connect_from(settings)
    kwargs = client.connection_pool.connection_kwargs
    assert client.connection_pool.connection_class is redis.SSLConnection
    assert (kwargs["socket_connect_timeout"], kwargs["socket_timeout"]) == (
        CONNECT_TIMEOUT_SECONDS,
        READ_TIMEOUT_SECONDS,
    )
    assert client.set("tls-probe", "1", ex=5) and client.get("tls-probe") == "1"
    popper = blocking_client(client, 0.1)
    assert popper.blpop(["tls-empty"], timeout=0.1) is None
    assert popper.connection_pool.connection_kwargs["socket_timeout"] > 0.1

    async def ping_async() -> bool:
        async_client = connect_async_from(settings, read_timeout=READ_TIMEOUT_SECONDS)
        try:
            return bool(await async_client.ping())
        finally:
            await async_client.aclose()

    assert asyncio.run(ping_async())
    client.delete("tls-probe")
    client.close()


def test_a_server_the_ca_did_not_sign_is_refused(tls_redis: str) -> None:
    client = make_client(tls_redis)  # no CA: the system's store does not know the test CA
    with pytest.raises(redis.ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
        client.ping()


def test_a_ca_file_without_a_tls_url_names_the_setting(tls_files: TlsFiles) -> None:
    with pytest.raises(ValidationError, match=r"redis_url: 'redis://127.0.0.1:6379/0' is not a rediss://"):
        Settings(redis_url="redis://127.0.0.1:6379/0", redis_ssl_ca_certs=str(tls_files.ca))


def test_the_command_line_reads_the_queue_over_tls(
    tls_redis: str, tls_files: TlsFiles, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "TIDEGATE_REDIS_URL": tls_redis,
        "TIDEGATE_REDIS_SSL_CA_CERTS": str(tls_files.ca),
        "TIDEGATE_QUEUE_NAME": "tls-cli",
    }
    command = [sys.executable, "-c", "from tidegate.cli import main; main()", "status", "--json"]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["queue"] == "tls-cli"
