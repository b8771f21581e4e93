"""Which callback targets tidegate may contact, so `callback_url` cannot reach inside the bank.

A branch names the URL, but tidegate's own network sends the request: without this check a branch
could make tidegate POST to loopback services, the internal network or the cloud metadata address
(server-side request forgery). The host is resolved and every address it resolves to must be public,
unless the policy's `[callbacks] allow_hosts` lists the name, the address or its network. The same
check runs at submission and again when delivering, against the address actually connected to, so a
name that resolves differently later (DNS rebinding) is still refused.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from urllib.parse import urlsplit

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack
        "169.254.170.2",  # AWS ECS task metadata
        "fd00:ec2::254",  # AWS over IPv6
        "100.100.100.200",  # Alibaba Cloud
    )
)
METADATA_NAMES = frozenset({"metadata.google.internal", "metadata.goog", "metadata"})


class RefusedTarget(ValueError):
    """A callback target tidegate will not contact; the message names the host, address and class."""


def address_class(address: IpAddress) -> str | None:
    """The refused class of `address` (e.g. "loopback"), or None for a public address."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address in METADATA_ADDRESSES:
        return "cloud metadata"
    checks = (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("private", address.is_private),
    )
    for name, hit in checks:
        if hit:
            return name
    return None if address.is_global else "reserved (not globally routable)"


def resolve(host: str, port: int) -> list[IpAddress]:
    """Every address `host` resolves to (tests replace this function to avoid real lookups)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos))


def _literal(host: str) -> IpAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _allowed(address: IpAddress, allow_hosts: Sequence[str]) -> bool:
    for entry in allow_hosts:
        if "/" in entry:
            if address in ipaddress.ip_network(entry, strict=False):
                return True
        elif _literal(entry) == address:
            return True
    return False


def _refused(shown: str, kind: str) -> RefusedTarget:
    return RefusedTarget(
        f"host {shown} is a {kind} address; callbacks go only to public addresses "
        "unless the policy's [callbacks] allow_hosts lists the host"
    )


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


def safe_addresses(host: str, port: int, allow_hosts: Sequence[str]) -> list[IpAddress]:
    """The addresses of `host` tidegate may connect to; RefusedTarget if any of them is refused.

    Every address must pass, not just the first: a connection may use any of them.
    """
    name = host.strip("[]").rstrip(".").lower()
    literal = _literal(name)
    if literal is None and name in METADATA_NAMES and name not in allow_hosts:
        raise _refused(host, "cloud metadata")
    if literal is not None:
        addresses = [literal]
    else:
        try:
            addresses = resolve(name, port)
        except (OSError, UnicodeError) as exc:
            raise RefusedTarget(f"host {host!r} does not resolve ({exc})") from None
        if not addresses:
            raise RefusedTarget(f"host {host!r} does not resolve")
    if name in allow_hosts:
        return addresses
    for address in addresses:
        refused = address_class(address)
        if refused is not None and not _allowed(address, allow_hosts):
            shown = host if literal is not None else f"{host} ({address})"
            raise _refused(shown, refused)
    return addresses


def check_url(url: str, allow_hosts: Sequence[str]) -> list[IpAddress]:
    """`safe_addresses` for the host and port of `url`."""
    parts = urlsplit(url)
    if not parts.hostname:
        raise RefusedTarget(f"callback URL {url!r} has no host")
    try:
        port = parts.port or _default_port(parts.scheme)
    except ValueError:
        raise RefusedTarget(f"callback URL {url!r} has an invalid port") from None
    return safe_addresses(parts.hostname, port, allow_hosts)
