"""What the outbound-URL tests are built from: a real HTTP(S) receiver on a loopback address and a port the kernel
picks, that records every request it gets, and a throw-away certificate authority for the HTTPS one."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


@dataclass
class Seen:
    method: str
    path: str
    host: str
    body: bytes


@dataclass
class Receiver:
    """An HTTP server on ``address`` (port 0: the kernel's choice, or ``port``) that records what reaches it and
    answers ``status`` with ``body`` and ``headers``; with ``tls`` (an SSLContext) it speaks HTTPS and records the
    name each client asked for in its TLS hello (SNI)."""

    address: str = "127.0.0.1"
    port: int = 0
    status: int = 200
    body: bytes = b""
    headers: dict = field(default_factory=dict)
    tls: ssl.SSLContext | None = None
    seen: list[Seen] = field(default_factory=list)
    server_names: list[str | None] = field(default_factory=list)

    def __post_init__(self):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                receiver.seen.append(
                    Seen(self.command, self.path, self.headers.get("Host", ""), self.rfile.read(length))
                )
                self.send_response(receiver.status)
                for name, value in receiver.headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(receiver.body)))
                self.end_headers()
                self.wfile.write(receiver.body)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer((self.address, self.port), Handler)
        self.port = self.server.server_address[1]
        if self.tls is not None:
            self.tls.sni_callback = lambda sock, name, context: self.server_names.append(name)
            self.server.socket = self.tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, host: str | None = None, path: str = "/hook") -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://{host or self.address}:{self.port}{path}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class CertificateAuthority:
    """A throw-away CA (written to ``directory``) that signs server certificates for the names asked."""

    def __init__(self, directory: Path):
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self._x509, self._hashes, self._serialization, self._ec, self._oid = (
            x509,
            hashes,
            serialization,
            ec,
            NameOID,
        )
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lockstep test CA")])
        self.cert = (
            self._builder(name, name, self.key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.path = directory / "ca.pem"
        self.path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def _builder(self, subject, issuer, public_key):
        now = datetime.datetime.now(datetime.UTC)
        return (
            self._x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(self._x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(hours=1))
        )

    def server_context(self, *names: str) -> ssl.SSLContext:
        """A server-side SSLContext with a certificate for ``names`` (DNS names or IP addresses)."""
        x509, serialization = self._x509, self._serialization
        key = self._ec.generate_private_key(self._ec.SECP256R1())
        alternatives = []
        for name in names:
            try:
                alternatives.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                alternatives.append(x509.DNSName(name))
        subject = x509.Name([x509.NameAttribute(self._oid.COMMON_NAME, names[0])])
        cert = (
            self._builder(subject, self.cert.subject, key.public_key())
            .add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
            .sign(self.key, self._hashes.SHA256())
        )
        stem = self.directory / names[0].replace(":", "_")
        cert_path, key_path = stem.with_suffix(".crt"), stem.with_suffix(".key")
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_path, key_path)
        return context
