"""Outbound URLs: every URL a user sets and a worker fetches is checked here, once, and connected to as checked.

A notification channel, an add-on repository: whoever sets the URL must not make Lockstep's workers reach what only
the installation can reach (SSRF) — loopback, the cloud's metadata service at 169.254.169.254, private networks.
``check_url`` is the one check, at input and before each fetch:

- the URL is parsed by the library that connects (requests prepares it, urllib3 parses it), and one the standard
  library reads differently is refused, as are backslashes, user names and passwords, spaces and control
  characters: what is checked is what is fetched;
- the host is canonical: an ASCII (IDNA) name of letter-digit-hyphen labels, a dotted-decimal IPv4 address or an
  IPv6 address in brackets without a zone; 2130706433, 0x7f.1, 017.0.0.1 and a trailing dot are refused;
- every address it names (the literal, or all the name resolves to) must be a public one: loopback, private,
  link-local, shared (100.64/10), multicast, reserved, unspecified and documentation addresses are refused, in
  IPv4 and IPv6, and an IPv6 address that carries an IPv4 one (v4-mapped, 6to4, Teredo, NAT64) is judged by it
  too, unless the provider allows a range with OUTBOUND_ALLOWED_NETWORKS (unspecified and multicast never).

At input (``resolve=False``) a name is not looked up (it may resolve elsewhere by the time it is used); only
``localhost`` names are known to be loopback. Before a fetch the name is resolved once, and ``outbound_session``
connects to the address that was checked — not to what a second lookup answers (DNS rebinding) — while the Host
header, TLS SNI and certificate verification use the name. ``outbound_post`` follows no redirect (a caller that
follows them gets each hop checked and pinned by the same adapter). No proxy from the environment is used: a proxy
would resolve the name itself.
"""

import functools
import ipaddress
import re
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import idna
import requests
from django.conf import settings
from requests.adapters import HTTPAdapter
from urllib3 import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.util import parse_url

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_URL = 2048
HTTP_SCHEMES = ("http", "https")
DEFAULT_PORTS = {"http": 80, "https": 443, "oci": 443}
# A DNS label (underscores occur in real names); a numeric last label makes the host an IPv4 address (WHATWG URL).
LABEL = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
NUMERIC_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")
LOCALHOST = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))  # RFC 6761: always loopback
NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))


class OutboundRefused(ValueError):
    """A URL Lockstep will not fetch; the message says why, in words for whoever set it."""


@dataclass(frozen=True)
class Target:
    """A checked URL: ``url`` as it is sent, its host (ASCII, lower case, an IPv6 literal without brackets), port,
    and the addresses checked (empty when not resolved); a fetch connects to the first of them."""

    url: str
    scheme: str
    host: str
    port: int
    literal: bool
    addresses: tuple[IPAddress, ...] = field(default=())

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == DEFAULT_PORTS.get(self.scheme) else f"{host}:{self.port}"


def check_url(
    url, *, schemes: tuple[str, ...] = HTTP_SCHEMES, resolve: bool = True, unresolved_ok: bool = False
) -> Target:
    """The checked target of ``url``, or OutboundRefused saying why it may not be fetched.

    ``resolve``: look the name up now (before a fetch) and check every address; without it (at input) a name is
    checked for its form only. ``unresolved_ok``: a name that does not resolve is no reason to refuse (a tool that
    fetches it will fail on its own)."""
    scheme, final = _prepared(url, schemes)
    parsed = _parse(final, scheme)
    host, literal = _canonical_host(parsed.host)
    port = parsed.port or DEFAULT_PORTS[scheme]
    if literal is not None:
        addresses: tuple[IPAddress, ...] = (literal,)
    elif host == "localhost" or host.endswith(".localhost"):
        addresses = LOCALHOST
    elif resolve:
        addresses = _resolve(host, port, unresolved_ok=unresolved_ok)
    else:
        addresses = ()
    for address in addresses:
        problem = address_problem(address)
        if problem:
            shown = str(address) if literal is not None else f"{host} is {address}, which"
            raise OutboundRefused(f"{shown} {problem}")
    return Target(
        url=final, scheme=scheme, host=host, port=port, literal=literal is not None, addresses=addresses
    )


def _prepared(url, schemes) -> tuple[str, str]:
    """The URL's scheme and the URL as the connecting library will send it."""
    if not isinstance(url, str) or not url:
        raise OutboundRefused("a URL is required")
    if len(url) > MAX_URL:
        raise OutboundRefused(f"a URL of at most {MAX_URL} characters")
    if "\\" in url:
        raise OutboundRefused("a URL without backslashes (URL parsers disagree on what they mean)")
    if any(ord(char) <= 0x20 or 0x7F <= ord(char) <= 0x9F for char in url):
        raise OutboundRefused("a URL without spaces or control characters")
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme not in schemes:
        raise OutboundRefused(f"a URL starting {' or '.join(f'{s}://' for s in schemes)}")
    try:
        authority = urlsplit(url).netloc
    except ValueError:
        raise OutboundRefused("not a valid URL") from None
    if "%" in authority:  # an escaped host name or an IPv6 zone: neither is what is connected to, as written
        raise OutboundRefused("a host without percent-escapes or an IPv6 zone")
    if re.search(r":0*$", authority):  # port 0 is dropped when the URL is prepared: not the port written
        raise OutboundRefused("a URL with a port between 1 and 65535")
    if scheme not in HTTP_SCHEMES:
        return scheme, url
    prepared = requests.PreparedRequest()
    try:
        prepared.prepare_url(url, None)
    except (requests.RequestException, ValueError, UnicodeError):
        raise OutboundRefused("not a valid URL") from None
    return scheme, prepared.url


def _parse(final: str, scheme: str):
    try:
        parsed = parse_url(final)
        standard = urlsplit(final)
        standard_port = standard.port
    except ValueError:
        raise OutboundRefused("not a valid URL") from None
    if parsed.auth is not None or "@" in standard.netloc:
        raise OutboundRefused("a URL without a user name or password (put credentials elsewhere)")
    if not parsed.host:
        raise OutboundRefused("a URL with a host")
    if parsed.scheme != scheme or (standard.hostname or "") != parsed.host.strip("[]").lower():
        raise OutboundRefused("a URL whose host every parser reads alike")
    if standard_port != parsed.port or (parsed.port is not None and not 0 < parsed.port < 65536):
        raise OutboundRefused("a URL with a port between 1 and 65535")
    return parsed


def _canonical_host(host: str) -> tuple[str, IPAddress | None]:
    """The host in canonical form (ASCII, lower case) and the address it is, if it is one."""
    if host.startswith("["):
        inner = host[1:-1]
        if "%" in inner:
            raise OutboundRefused("an IPv6 address without a zone")
        try:
            return inner.lower(), ipaddress.IPv6Address(inner)
        except ValueError:
            raise OutboundRefused(f"{inner!r} is not an IPv6 address") from None
    if not host.isascii():
        try:
            host = idna.encode(host, uts46=True).decode("ascii")
        except (idna.IDNAError, UnicodeError, ValueError):
            raise OutboundRefused("a host name that IDNA can encode") from None
    host = host.lower()
    if host.endswith("."):
        raise OutboundRefused("a host without a trailing dot")
    labels = host.split(".")
    if NUMERIC_LABEL.match(
        labels[-1]
    ):  # an IPv4 address, whatever its notation: only dotted decimal is taken
        try:
            address = ipaddress.IPv4Address(host)
        except ValueError:
            address = None
        if address is None or str(address) != host:
            raise OutboundRefused(
                f"{host} is not an IPv4 address in dotted-decimal form (such as 192.0.2.10)"
            )
        return host, address
    if len(host) > 253 or not all(LABEL.match(label) for label in labels):
        raise OutboundRefused(f"{host[:100]!r} is not a valid host name")
    return host, None


def _resolve(host: str, port: int, *, unresolved_ok: bool) -> tuple[IPAddress, ...]:
    try:
        answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        if unresolved_ok:
            return ()
        raise OutboundRefused(f"the host {host} does not resolve") from None
    addresses = tuple(
        dict.fromkeys(
            ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
            for info in answers
            if info[0] in (socket.AF_INET, socket.AF_INET6)
        )
    )
    if not addresses and not unresolved_ok:
        raise OutboundRefused(f"the host {host} does not resolve")
    return addresses


@functools.lru_cache(maxsize=8)
def _networks(allowed: tuple[str, ...]) -> tuple:
    return tuple(ipaddress.ip_network(network, strict=False) for network in allowed)


def allowed_networks() -> tuple:
    """The ranges the provider allows outbound URLs to reach although they are not public (OUTBOUND_ALLOWED_NETWORKS)."""
    configured = settings.OUTBOUND_ALLOWED_NETWORKS
    if isinstance(configured, str):  # as the environment writes it
        configured = configured.split(",")
    return _networks(tuple(network.strip() for network in configured if network.strip()))


def address_problem(address: IPAddress) -> str | None:
    """Why Lockstep will not connect to ``address`` (a phrase), or None when it may."""
    if address.is_unspecified:
        return "is the unspecified address"
    if address.is_multicast:
        return "is a multicast address"
    for inner in _carried(address):
        problem = address_problem(inner)
        if problem:
            return f"carries {inner}, which {problem}"
    if any(address in network for network in allowed_networks()):
        return None
    kind = next(
        (
            name
            for name, test in (
                ("a loopback", address.is_loopback),
                ("a link-local", address.is_link_local),
                ("a private", address.is_private),
                ("a reserved", address.is_reserved),
                ("a site-local", getattr(address, "is_site_local", False)),
                ("a non-public", not address.is_global),
            )
            if test
        ),
        None,
    )
    if kind is None:
        return None
    return f"is {kind} address (OUTBOUND_ALLOWED_NETWORKS may allow its range)"


def _carried(address: IPAddress) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address carries: v4-mapped, 6to4, Teredo's client, NAT64."""
    if address.version != 6:
        return []
    carried = [address.ipv4_mapped, address.sixtofour, address.teredo[1] if address.teredo else None]
    if any(address in network for network in NAT64):
        carried.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return [inner for inner in carried if inner is not None]


class PinnedAdapter(HTTPAdapter):
    """A requests adapter that checks each request's URL (``check_url``, resolving once) and connects to the
    address it checked; the Host header, TLS SNI and certificate verification use the URL's host name."""

    def __init__(self):
        super().__init__(max_retries=0)
        self._pinned: dict[tuple, HTTPConnectionPool] = {}

    def get_connection_with_tls_context(self, request, verify, proxies=None, cert=None):
        target = check_url(request.url)
        address = target.addresses[0]
        key = (target.scheme, address, target.port, target.host)
        pool = self._pinned.get(key)
        if pool is None:
            if target.scheme == "https":
                pool = HTTPSConnectionPool(
                    str(address), target.port, server_hostname=None if target.literal else target.host
                )
            else:
                pool = HTTPConnectionPool(str(address), target.port)
            self._pinned[key] = pool
        request.headers["Host"] = target.host_header
        return pool

    def request_url(self, request, proxies):
        return request.path_url  # never through a proxy

    def close(self):
        super().close()
        for pool in self._pinned.values():
            pool.close()
        self._pinned.clear()


class OutboundSession(requests.Session):
    """A requests session for user-set URLs: each URL's form checked as written (requests rewrites some of what
    ``check_url`` refuses: a backslash becomes %5C in the path), then checked and pinned when sent (PinnedAdapter,
    every redirect hop too); no proxy taken from the environment."""

    def __init__(self):
        super().__init__()
        self.trust_env = False
        adapter = PinnedAdapter()
        self.mount("http://", adapter)
        self.mount("https://", adapter)

    def request(self, method, url, *args, **kwargs):
        check_url(url, resolve=False)
        return super().request(method, url, *args, **kwargs)


def outbound_session() -> requests.Session:
    """A session for fetching user-set URLs (OutboundSession)."""
    return OutboundSession()


def outbound_post(url: str, *, json, timeout: float) -> requests.Response:
    """POST ``json`` to a user-set URL, checked and pinned; the response's body is not read (nothing that answers
    is trusted to be small, and what an internal service says must not reach whoever set the URL)."""
    with outbound_session() as session:
        response = session.post(url, json=json, timeout=timeout, allow_redirects=False, stream=True)
        response.close()
        return response
