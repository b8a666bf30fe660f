"""A TLS-terminating gRPC proxy in front of the suite's Temporal dev server, for the tests of
Temporal connections as Temporal users configure them (issue 25, item 1).

:func:`make_pki` makes a CA of its own (``cryptography``), a server certificate for
``localhost``/127.0.0.1 and a client certificate, plus a second CA's client certificate (the
"wrong certificate"). :class:`TlsProxy` runs the system's nginx (``scripts/test.sh`` installs
it when missing) with two listeners on loopback, each passing gRPC on to the dev server:

- ``mtls``: TLS, and a client certificate of the CA required;
- ``api_key``: TLS, and ``authorization: Bearer <key>`` required (anything else: HTTP 401).
"""

from __future__ import annotations

import datetime
import ipaddress
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from flower.services._servers import free_port

NGINX = "nginx"


@dataclass
class Pki:
    dir: Path

    @property
    def ca(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def client_cert(self) -> Path:
        return self.dir / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.dir / "client.key"

    @property
    def wrong_cert(self) -> Path:
        return self.dir / "wrong.pem"

    @property
    def wrong_key(self) -> Path:
        return self.dir / "wrong.key"


def make_pki(dir: Path) -> Pki:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    dir.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        path.chmod(0o600)

    def write_cert(cert: x509.Certificate, path: Path) -> None:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(name(cn))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        return key, cert

    def issue(
        ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, cn: str, server: bool
    ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(name(cn))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                critical=False,
            )
        )
        if server:
            builder = builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
        return key, builder.sign(ca_key, hashes.SHA256())

    ca_key, ca_cert = ca("flower test CA")
    write_cert(ca_cert, dir / "ca.pem")
    server_key, server_cert = issue(ca_key, ca_cert, "localhost", server=True)
    write_cert(server_cert, dir / "server.pem")
    write_key(server_key, dir / "server.key")
    client_key, client_cert = issue(ca_key, ca_cert, "flower worker", server=False)
    write_cert(client_cert, dir / "client.pem")
    write_key(client_key, dir / "client.key")
    other_key, other_cert = ca("someone else's CA")
    wrong_key, wrong_cert = issue(other_key, other_cert, "flower worker", server=False)
    write_cert(wrong_cert, dir / "wrong.pem")
    write_key(wrong_key, dir / "wrong.key")
    return Pki(dir)


CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 512; }}
http {{
    access_log off;
    client_body_temp_path {dir}/tmp/body;
    proxy_temp_path {dir}/tmp/proxy;
    fastcgi_temp_path {dir}/tmp/fastcgi;
    uwsgi_temp_path {dir}/tmp/uwsgi;
    scgi_temp_path {dir}/tmp/scgi;
    ssl_certificate {dir}/pki/server.pem;
    ssl_certificate_key {dir}/pki/server.key;
    # a worker's long polls last about a minute
    grpc_read_timeout 600s;
    grpc_send_timeout 600s;
    client_body_timeout 600s;
    keepalive_timeout 600s;
    http2_idle_timeout 600s;
    server {{
        listen 127.0.0.1:{mtls} ssl http2;
        ssl_client_certificate {dir}/pki/ca.pem;
        ssl_verify_client on;
        location / {{ grpc_pass grpc://{upstream}; }}
    }}
    server {{
        listen 127.0.0.1:{api_key} ssl http2;
        location / {{
            if ($http_authorization != "Bearer {key}") {{ return 401; }}
            grpc_pass grpc://{upstream};
        }}
    }}
}}
"""


class TlsProxy:
    """nginx in ``dir`` in front of ``upstream`` (HOST:PORT); a context manager."""

    def __init__(self, dir: Path, upstream: str, key: str) -> None:
        self.dir, self.upstream, self.key = dir, upstream, key
        self.mtls = self.api_key = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.pki = make_pki(dir / "pki")

    def __enter__(self) -> TlsProxy:
        binary = shutil.which(NGINX) or "/usr/sbin/nginx"
        (self.dir / "tmp").mkdir(parents=True, exist_ok=True)
        self.mtls, self.api_key = free_port(), free_port()
        conf = self.dir / "nginx.conf"
        conf.write_text(
            CONF.format(
                dir=self.dir,
                mtls=self.mtls,
                api_key=self.api_key,
                upstream=self.upstream,
                key=self.key,
            ),
            encoding="utf-8",
        )
        log = open(self.dir / "nginx.out", "wb")
        self.proc = subprocess.Popen(
            [binary, "-p", str(self.dir), "-c", str(conf)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + 30
        while not all(_listening(p) for p in (self.mtls, self.api_key)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                out = (self.dir / "nginx.out").read_text(errors="replace")
                err = (self.dir / "error.log").read_text(errors="replace")
                self.__exit__()
                raise RuntimeError(f"nginx did not start: {out} {err}")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0
