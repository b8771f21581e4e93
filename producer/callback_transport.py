"""An HTTP session whose every connection is checked against `shared.callback_targets` first.

The check runs where urllib3 opens the socket: the host is resolved once, every address is checked,
and the socket goes to a checked address. So the address connected to is the address approved (no
second lookup that DNS rebinding could answer differently), and a refused target gets no packet at
all. TLS still verifies the certificate against the URL's host name, as urllib3 does.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError
from urllib3.util import connection

from shared.callback_targets import safe_addresses


def _guarded_new_conn(conn: HTTPConnection, allow_hosts: Sequence[str]) -> socket.socket:
    """Connect to the first reachable approved address of the connection's host."""
    last: Exception | None = None
    for address in safe_addresses(conn.host, conn.port or 80, allow_hosts):
        try:
            return connection.create_connection(
                (str(address), conn.port or 80),
                conn.timeout,
                source_address=conn.source_address,
                socket_options=conn.socket_options,
            )
        except TimeoutError as exc:
            last = ConnectTimeoutError(conn, f"connection to {conn.host} ({address}) timed out: {exc}")
        except OSError as exc:
            last = NewConnectionError(conn, f"failed to connect to {conn.host} ({address}): {exc}")
    assert last is not None  # safe_addresses returns at least one address or raises
    raise last


def _connection_classes(allow_hosts: Sequence[str]) -> tuple[type[HTTPConnection], type[HTTPSConnection]]:
    class GuardedHTTPConnection(HTTPConnection):
        def _new_conn(self) -> socket.socket:
            return _guarded_new_conn(self, allow_hosts)

    class GuardedHTTPSConnection(HTTPSConnection):
        def _new_conn(self) -> socket.socket:
            return _guarded_new_conn(self, allow_hosts)

    return GuardedHTTPConnection, GuardedHTTPSConnection


class _GuardedAdapter(HTTPAdapter):
    def __init__(self, allow_hosts: Sequence[str]) -> None:
        self._allow_hosts = tuple(allow_hosts)
        super().__init__(max_retries=0)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        plain, tls = _connection_classes(self._allow_hosts)
        http_pool = type("GuardedHTTPPool", (HTTPConnectionPool,), {"ConnectionCls": plain})
        https_pool = type("GuardedHTTPSPool", (HTTPSConnectionPool,), {"ConnectionCls": tls})
        self.poolmanager.pool_classes_by_scheme = {"http": http_pool, "https": https_pool}


def guarded_session(allow_hosts: Sequence[str]) -> requests.Session:
    """A session that connects only to approved addresses, ignores proxy variables (the proxy's
    address would be checked instead of the target's) and never follows redirects on its own."""
    session = requests.Session()
    session.trust_env = False
    session.max_redirects = 0
    adapter = _GuardedAdapter(allow_hosts)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
