"""A throw-away PKI for the security tests, made with the real `openssl` command: a CA, the
service's certificate (localhost, 127.0.0.1) and client certificates carrying SPIFFE IDs."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from faultcast.testing.system import require_binary

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


class Authority:
    def __init__(self, directory: Path, name: str) -> None:
        self.openssl = require_binary("openssl")
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.ca = Pair(directory / f"{name}-ca.pem", directory / f"{name}-ca.key")
        self._run("req", "-x509", *_EC, "-keyout", str(self.ca.key), "-out", str(self.ca.cert),
                  "-days", "2", "-subj", f"/CN={name} test CA")  # fmt: skip

    def _run(self, *args: str) -> None:
        done = subprocess.run([self.openssl, *args], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"openssl {args[0]} failed: {done.stderr}")

    def issue(self, name: str, subject_alt_names: str) -> Pair:
        """A leaf certificate for `name`, e.g. SANs "URI:spiffe://faultcast/collector/node-a"."""
        pair = Pair(self.dir / f"{name}.pem", self.dir / f"{name}.key")
        csr, ext = self.dir / f"{name}.csr", self.dir / f"{name}.ext"
        self._run("req", *_EC, "-keyout", str(pair.key), "-out", str(csr), "-subj", f"/CN={name}")
        ext.write_text(f"subjectAltName={subject_alt_names}\nbasicConstraints=CA:FALSE\n")
        self._run("x509", "-req", "-in", str(csr), "-CA", str(self.ca.cert), "-CAkey", str(self.ca.key),
                  "-CAcreateserial", "-out", str(pair.cert), "-days", "2", "-extfile", str(ext))  # fmt: skip
        return pair

    def server(self) -> Pair:
        return self.issue("service", "DNS:localhost,IP:127.0.0.1")

    def client(self, role: str, name: str, domain: str = "faultcast") -> Pair:
        return self.issue(f"{domain}-{role}-{name}", f"URI:spiffe://{domain}/{role}/{name}")
