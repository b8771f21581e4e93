"""Callbacks cannot be aimed inside the bank, and deliveries are signed with the branch's secret.

Every test here watches the sockets this process opens: an attempt to reach anything but loopback
fails the test before a packet leaves, and refused targets must see no connection at all.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import socket
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from producer.callbacks import CallbackRefused, deliver_callback
from shared import callback_targets
from shared.config import Settings
from shared.queue import TicketQueue
from tests.producer.api.conftest import Api
from tests.producer.api.peer import Answer, ScriptedPeer

OK: Answer = (200, {}, {"received": True})

REFUSED = [
    ("http://127.0.0.2:9/hook", "loopback"),  # 127.0.0.1 is allow-listed in these tests
    ("http://127.8.9.10/hook", "loopback"),
    ("http://[::1]:9/hook", "loopback"),
    ("http://[::ffff:127.0.0.2]/hook", "loopback"),
    ("http://10.1.2.3/hook", "private"),
    ("http://172.16.5.4/hook", "private"),
    ("https://192.168.0.10/hook", "private"),
    ("http://[fd12:3456::1]/hook", "private"),
    ("http://169.254.10.10/hook", "link-local"),
    ("http://[fe80::1]/hook", "link-local"),
    ("http://224.0.0.251/hook", "multicast"),
    ("http://[ff02::1]/hook", "multicast"),
    ("http://0.0.0.0/hook", "unspecified"),
    ("http://[::]/hook", "unspecified"),
    ("http://169.254.169.254/latest/meta-data/", "cloud metadata"),
    ("http://100.100.100.200/latest/meta-data/", "cloud metadata"),
    ("http://metadata.google.internal/computeMetadata/v1/", "cloud metadata"),
    ("http://100.64.0.1/hook", "reserved"),
]


class ConnectSpy:
    """Records every address this process connects to; anything but loopback is stopped."""

    def __init__(self) -> None:
        self.addresses: list[tuple[str, int]] = []

    def to(self, host: str, port: int) -> bool:
        return (host, port) in self.addresses


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> ConnectSpy:
    spy = ConnectSpy()
    original = socket.socket.connect

    def connect(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            host, port = str(address[0]), int(address[1])
            spy.addresses.append((host, port))
            if not ipaddress.ip_address(host).is_loopback:
                raise OSError(f"test guard: refusing to connect to non-loopback {host}:{port}")
        original(sock, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    return spy


@pytest.fixture
def resolved(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Host name → addresses the resolver answers; no real lookup happens in these tests."""
    table: dict[str, list[str]] = {}

    def resolve(host: str, port: int) -> list[callback_targets.IpAddress]:
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, f"{host} not in the test's table")
        return [ipaddress.ip_address(a) for a in table[host]]

    monkeypatch.setattr(callback_targets, "resolve", resolve)
    return table


@pytest.fixture
def api_settings(api_settings: Settings, loopback_callbacks_policy: str) -> Settings:
    """The API of these tests allows one loopback receiver address, 127.0.0.1, and nothing else."""
    return Settings(**api_settings.model_dump(exclude={"policy_file"}), policy_file=loopback_callbacks_policy)


def _submit(api: Api, branch: requests.Session, url: str) -> requests.Response:
    return branch.post(
        api.url("/v1/tickets"), json={"type": "complaint", "prompt": "hi", "callback_url": url}
    )


def _refusal(response: requests.Response) -> str:
    """The 422's message for callback_url (the test fails if another field is named)."""
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == "callback_url"
    [issue] = error["issues"]
    assert issue["loc"] == ["body", "callback_url"]
    return str(issue["msg"])


def _finish(ticket_queue: TicketQueue, ticket_id: str) -> None:
    [claimed] = ticket_queue.claim("w-callback-safety", 1)
    assert claimed.ticket.id == ticket_id
    assert ticket_queue.finish(ticket_id, claimed.token, "done", result="approved")


@pytest.mark.parametrize(("url", "kind"), REFUSED)
def test_each_inside_address_class_is_refused_at_submission(
    api: Api,
    branch: requests.Session,
    connects: ConnectSpy,
    resolved: dict[str, list[str]],
    url: str,
    kind: str,
) -> None:
    message = _refusal(_submit(api, branch, url))
    assert kind in message and "allow_hosts" in message
    parts = urlsplit(url)
    assert parts.hostname is not None
    assert not connects.to(parts.hostname, parts.port or 80)


def test_a_name_is_refused_when_any_of_its_addresses_is_inside(
    api: Api, branch: requests.Session, connects: ConnectSpy, resolved: dict[str, list[str]]
) -> None:
    resolved["hooks.branch.example"] = ["93.184.216.34", "10.9.8.7"]
    assert "10.9.8.7" in _refusal(_submit(api, branch, "https://hooks.branch.example/cb"))
    resolved["hooks.branch.example"] = ["93.184.216.34"]
    assert _submit(api, branch, "https://hooks.branch.example/cb").status_code == 202
    assert "does not resolve" in _refusal(_submit(api, branch, "https://nowhere.branch.example/cb"))


def test_a_name_that_rebinds_inside_is_refused_at_delivery_with_nothing_sent(
    api: Api,
    branch: requests.Session,
    ticket_queue: TicketQueue,
    redis_url: str,
    connects: ConnectSpy,
    resolved: dict[str, list[str]],
) -> None:
    resolved["hooks.branch.example"] = ["93.184.216.34"]
    response = _submit(api, branch, "http://hooks.branch.example:8080/cb")
    assert response.status_code == 202, response.text
    ticket_id = response.json()["id"]
    _finish(ticket_queue, ticket_id)
    resolved["hooks.branch.example"] = ["10.0.0.7"]  # the name now points inside the bank
    with pytest.raises(CallbackRefused, match=r"10\.0\.0\.7.*private"):
        deliver_callback(api.settings.queue_name, ticket_id, redis_url, timeout=2, allow_hosts=("127.0.0.1",))
    assert not connects.to("10.0.0.7", 8080) and not connects.to("93.184.216.34", 8080)


def test_an_allow_listed_receiver_gets_deliveries_signed_with_the_branch_secret(
    api: Api, branch: requests.Session, ticket_queue: TicketQueue, redis_url: str, connects: ConnectSpy
) -> None:
    secret = api.keys.create_callback_secret("0412")
    assert secret is not None and secret.startswith("whsec_")
    assert api.keys.create_callback_secret("0412") is None  # shown once: a second call creates nothing
    with ScriptedPeer([OK]) as peer:
        response = _submit(api, branch, peer.url + "/hooks/tidegate")
        assert response.status_code == 202, response.text
        ticket_id = response.json()["id"]
        _finish(ticket_queue, ticket_id)
        assert deliver_callback(api.settings.queue_name, ticket_id, redis_url) == 200
        rotated = api.keys.rotate_callback_secret("0412")  # a leaked secret is replaced
        assert deliver_callback(api.settings.queue_name, ticket_id, redis_url) == 200
    after = (peer.raw_bodies[1], peer.requests[1])
    assert Webhook(rotated).verify(*after)["id"] == ticket_id
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(*after)
    headers, body = peer.requests[0], peer.raw_bodies[0]
    assert Webhook(secret).verify(body, headers)["id"] == ticket_id
    # The spec by hand: v1,base64(HMAC-SHA256(key, "id.timestamp.body")), key = base64 after whsec_.
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    assert headers["webhook-signature"] == expected
    tampered = body.replace(b'"approved"', b'"declined"')
    assert tampered != body
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(tampered, headers)
    other = Webhook(base64.b64encode(b"another branch's secret 32 bytes").decode())
    with pytest.raises(WebhookVerificationError):
        other.verify(body, headers)


def test_the_allow_list_admits_only_what_it_names(
    api: Api, branch: requests.Session, connects: ConnectSpy
) -> None:
    assert _submit(api, branch, "http://127.0.0.1:9/hook").status_code == 202
    assert "loopback" in _refusal(_submit(api, branch, "http://127.0.0.2:9/hook"))
