"""Certificates for the TLS tests, made with ``openssl`` in a directory the test owns.

Runs in the test process.  :func:`make_pki` gives a CA, a server certificate it signed (for
127.0.0.1 and localhost, so ``verify-full``/``identity`` pass) and an unrelated second CA
(the "wrong CA" a client may be given).  Nothing here touches a server.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class Pki:
    ca: Path            # CA certificate, PEM
    server_cert: Path   # signed by ca, for 127.0.0.1 / localhost unless told otherwise
    server_key: Path
    wrong_ca: Path      # a CA that signed nothing here


def _openssl(*args: str) -> None:
    result = subprocess.run(["openssl", *args], capture_output=True, text=True)
    assert result.returncode == 0, f"openssl {' '.join(args)}: {result.stderr}"


def _make_ca(directory: Path, name: str) -> Path:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
             "-subj", f"/CN={name}", "-keyout", str(directory / f"{name}.key"),
             "-out", str(directory / f"{name}.pem"))
    return directory / f"{name}.pem"


def make_pki(directory: Path, names: str = "IP:127.0.0.1, DNS:localhost") -> Pki:
    """``names``: the server certificate's subjectAltName."""
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed (apt-get install openssl)")
    directory.mkdir(parents=True, exist_ok=True)
    ca = _make_ca(directory, "test-ca")
    wrong = _make_ca(directory, "wrong-ca")
    key, csr, cert = (directory / n for n in ("server.key", "server.csr", "server.pem"))
    _openssl("req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
             "-keyout", str(key), "-out", str(csr))
    ext = directory / "server.ext"
    ext.write_text(f"subjectAltName = {names}\n"
                   "basicConstraints = CA:FALSE\nkeyUsage = digitalSignature, keyEncipherment\n"
                   "extendedKeyUsage = serverAuth\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca),
             "-CAkey", str(directory / "test-ca.key"), "-CAcreateserial", "-days", "2",
             "-extfile", str(ext), "-out", str(cert))
    return Pki(ca=ca, server_cert=cert, server_key=key, wrong_ca=wrong)


def one_untrusted_error(log: str, message: str, sink: str) -> dict:
    """The single error line ``message`` of a sink whose server certificate does not verify:
    logged once (not once per retry), naming the sink, the reason and ``tls_ca_file``."""
    import json
    lines = [json.loads(line) for line in log.splitlines() if message in line]
    assert len(lines) == 1, lines
    line = lines[0]
    assert line["level"] == "error" and line["sink"] == sink, line
    assert "certificate verify failed" in line["error"] and "tls_ca_file" in line["fix"], line
    assert "Traceback" not in log
    return line
