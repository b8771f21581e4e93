"""A real Redis Cluster (3 masters + 3 replicas) and a Sentinel trio on loopback, for the suite.

Every server runs in a directory of its own under the test's temporary directory, on a free
loopback port, keeps nothing on disk beyond the cluster's node file, and is stopped at the end.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from redis import Redis

from shared.redis_conn import make_cluster_client
from tests.waiting import wait_until

START_SECONDS = 15.0
CLUSTER_OK_SECONDS = 30.0


def free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports whose +10000 bus ports are free too (cluster buses)."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port + 10000 > 65535 or port in ports:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        ports.append(port)
    return ports


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed")
    return path


def _wait_until(check: Callable[[], object], seconds: float, what: str) -> None:
    """Until `check` holds; an error from it (refused, loading, still forming) counts as not yet."""
    wait_until(check, seconds, what, interval=0.05, ignoring=(Exception,))


@dataclass
class RedisNode:
    """One redis-server process on 127.0.0.1:`port`."""

    port: int
    directory: Path
    process: subprocess.Popen[bytes]
    args: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> Redis:
        return Redis(port=self.port, socket_connect_timeout=1, socket_timeout=5, decode_responses=True)

    def info(self, section: str) -> dict[str, object]:
        client = self.client()
        try:
            return dict(client.info(section))
        finally:
            client.close()

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        """kill -9: no shutdown, no save, the way a machine dies."""
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def restart(self) -> None:
        """Start the same server again, as a machine that comes back (a cluster node rejoins)."""
        self.stop()
        self.process = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = self.client()
        _wait_until(lambda: self.alive() and client.ping(), START_SECONDS, f"redis-server on {self.port}")
        client.close()

    def stop(self) -> None:
        if not self.alive():
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextmanager
def redis_node(
    directory: Path, port: int, extra_args: Sequence[str] = (), config_file: Path | None = None
) -> Iterator[RedisNode]:
    """Start one redis-server (a sentinel when `extra_args` has `--sentinel`), stopped at the end."""
    directory.mkdir(parents=True, exist_ok=True)
    args = [_binary("redis-server"), *([str(config_file)] if config_file else [])]
    args += ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory)]
    if "--sentinel" not in extra_args:
        args += ["--save", "", "--appendonly", "no"]
    args += ["--logfile", str(directory / "redis.log"), *extra_args]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    node = RedisNode(port, directory, process, args)
    try:
        client = node.client()
        _wait_until(lambda: node.alive() and client.ping(), START_SECONDS, f"redis-server on {port}")
        client.close()
        yield node
    finally:
        node.stop()


@dataclass
class RedisClusterHarness:
    """Six nodes formed into a cluster; `masters()` reads the current roles from the nodes."""

    nodes: list[RedisNode]
    seed_url: str = field(init=False)

    def __post_init__(self) -> None:
        self.seed_url = self.nodes[0].url

    def seed_url_alive(self) -> str:
        """A URL of a node still running, for clients started after a kill."""
        return next(node.url for node in self.nodes if node.alive())

    def by_port(self, port: int) -> RedisNode:
        return next(node for node in self.nodes if node.port == port)

    def master_of(self, key: str) -> RedisNode:
        """The live node that owns `key`'s slot now, as the cluster itself reports it."""
        for node in self.nodes:
            if not node.alive():
                continue
            client = node.client()
            try:
                slot = int(client.execute_command("CLUSTER KEYSLOT", key))
                for start, end, master, *_ in client.execute_command("CLUSTER SLOTS"):
                    if int(start) <= slot <= int(end):
                        return self.by_port(int(master[1]))
            finally:
                client.close()
        raise RuntimeError("no live node answers")

    def wait_ok(self, seconds: float = CLUSTER_OK_SECONDS) -> None:
        """Until every live node says `cluster_state:ok` and agrees on who owns every slot."""

        def ok() -> bool:
            for node in self.nodes:
                if node.alive():
                    client = node.client()
                    try:
                        if client.cluster("info")["cluster_state"] != "ok":
                            return False
                    finally:
                        client.close()
            return True

        _wait_until(ok, seconds, "cluster_state:ok")

    def wait_replicated(self, key: str, seconds: float = CLUSTER_OK_SECONDS) -> None:
        """Until the master of `key`'s slot has a replica that is online (synced)."""

        def replicated() -> bool:
            info = self.master_of(key).info("replication")
            return any(isinstance(v, dict) and v.get("state") == "online" for v in info.values())

        _wait_until(replicated, seconds, f"a synced replica for {key}")

    def wait_promoted(self, dead: RedisNode, seconds: float = CLUSTER_OK_SECONDS) -> None:
        """Until a replica of the killed master owns its slots and the cluster is ok again."""
        dead_port = dead.port

        def promoted() -> bool:
            for node in self.nodes:
                if node.alive() and node.info("replication").get("role") == "master":
                    client = node.client()
                    try:
                        masters = {int(m[1]) for _, _, m, *_ in client.execute_command("CLUSTER SLOTS")}
                    finally:
                        client.close()
                    if dead_port in masters:
                        return False
            return True

        _wait_until(promoted, seconds, f"a replica to replace the master on {dead_port}")
        self.wait_ok(seconds)


@contextmanager
def redis_cluster(directory: Path, node_timeout_ms: int = 1000) -> Iterator[RedisClusterHarness]:
    """3 masters + 3 replicas on loopback (`--cluster-replicas 1`), stopped at the end."""
    ports = free_ports(6)
    args = ["--cluster-enabled", "yes", "--cluster-node-timeout", str(node_timeout_ms)]
    args += ["--repl-diskless-sync-delay", "0"]  # a rejoining replica syncs at once, not after 5 s
    with ExitStack() as stack:
        nodes = [
            stack.enter_context(
                redis_node(
                    directory / f"node-{port}",
                    port,
                    [*args, "--cluster-config-file", f"nodes-{port}.conf"],
                )
            )
            for port in ports
        ]
        create = [_binary("redis-cli"), "--cluster", "create"]
        create += [f"127.0.0.1:{port}" for port in ports]
        create += ["--cluster-replicas", "1", "--cluster-yes"]
        subprocess.run(create, check=True, capture_output=True, timeout=60)
        harness = RedisClusterHarness(nodes)
        harness.wait_ok()
        _wait_until(lambda: _replicas_in_sync(harness), CLUSTER_OK_SECONDS, "replicas in sync")
        yield harness


def _replicas_in_sync(harness: RedisClusterHarness) -> bool:
    roles = [node.info("replication") for node in harness.nodes]
    replicas = [r for r in roles if r.get("role") == "slave"]
    return len(replicas) == 3 and all(r.get("master_link_status") == "up" for r in replicas)


@dataclass
class SentinelHarness:
    """A primary, its replica and three sentinels watching them under `master_name`."""

    primary: RedisNode
    replica: RedisNode
    sentinels: list[RedisNode]
    master_name: str

    @property
    def sentinel_spec(self) -> str:
        """The `TIDEGATE_REDIS_SENTINELS` value for these sentinels."""
        return ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)

    def current_primary_port(self) -> int:
        client = self.sentinels[0].client()
        try:
            _host, port = client.execute_command("SENTINEL", "get-master-addr-by-name", self.master_name)
            return int(port)
        finally:
            client.close()


@contextmanager
def sentinel_trio(directory: Path, master_name: str = "tidegate") -> Iterator[SentinelHarness]:
    """1 primary, 1 replica, 3 `redis-server --sentinel` (quorum 2, fast failover), stopped at the end."""
    primary_port, replica_port, *sentinel_ports = free_ports(5)
    with ExitStack() as stack:
        primary = stack.enter_context(redis_node(directory / "primary", primary_port))
        replica = stack.enter_context(
            redis_node(directory / "replica", replica_port, ["--replicaof", "127.0.0.1", str(primary_port)])
        )
        _wait_until(
            lambda: replica.info("replication").get("master_link_status") == "up",
            START_SECONDS,
            "replica link",
        )
        sentinels = []
        for port in sentinel_ports:
            folder = directory / f"sentinel-{port}"
            folder.mkdir(parents=True)
            conf = folder / "sentinel.conf"
            conf.write_text(
                f"sentinel monitor {master_name} 127.0.0.1 {primary_port} 2\n"
                f"sentinel down-after-milliseconds {master_name} 1000\n"
                f"sentinel failover-timeout {master_name} 5000\n"
                f"sentinel parallel-syncs {master_name} 1\n",
                encoding="utf-8",
            )
            sentinels.append(stack.enter_context(redis_node(folder, port, ["--sentinel"], conf)))
        harness = SentinelHarness(primary, replica, sentinels, master_name)
        _wait_until(lambda: _sentinels_see(harness), START_SECONDS, "sentinels to find each other")
        yield harness


def _sentinels_see(harness: SentinelHarness) -> bool:
    for sentinel in harness.sentinels:
        client = sentinel.client()
        try:
            master = client.execute_command("SENTINEL", "master", harness.master_name)
            fields = dict(zip(master[::2], master[1::2], strict=True)) if isinstance(master, list) else master
            if int(fields["num-other-sentinels"]) < 2 or int(fields["num-slaves"]) < 1:
                return False
        finally:
            client.close()
    return True


ON_CLUSTER = os.environ.get("TIDEGATE_TEST_REDIS_CLUSTER") == "1"
"""`TIDEGATE_TEST_REDIS_CLUSTER=1`: the suite's Redis is a cluster the session starts (ops/test.sh)."""


def suite_client(url: str, *, decode_responses: bool = True) -> Redis:
    """A client of the suite's Redis at `url`: a cluster client when the suite runs on the cluster."""
    if ON_CLUSTER:
        return make_cluster_client(url, decode_responses=decode_responses)
    return Redis.from_url(url, decode_responses=decode_responses, socket_connect_timeout=2, socket_timeout=15)


def suite_env(url: str) -> dict[str, str]:
    """The TIDEGATE_* variables that point a child process at the suite's Redis."""
    env = {"TIDEGATE_REDIS_URL": url}
    if ON_CLUSTER:
        env["TIDEGATE_REDIS_CLUSTER"] = "true"
    return env
