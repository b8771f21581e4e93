"""A certificate authority and a server certificate for 127.0.0.1, made at test time with openssl."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_tls_files(directory: Path) -> TlsFiles:
    """A CA and a leaf signed by it whose names are 127.0.0.1 and localhost (what clients verify)."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    ca, ca_key = directory / "ca.pem", directory / "ca-key.pem"
    cert, key, request = directory / "server.pem", directory / "server-key.pem", directory / "server.csr"
    extensions = directory / "server.ext"
    extensions.write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
    )
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=tidegate test CA",
        "-keyout",
        str(ca_key),
        "-out",
        str(ca),
    )
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        str(key),
        "-out",
        str(request),
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        str(request),
        "-CA",
        str(ca),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        str(extensions),
        "-out",
        str(cert),
    )
    return TlsFiles(ca=ca, cert=cert, key=key)
