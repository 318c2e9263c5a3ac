"""A bounded fuzz of the outbound URL check (issue 54): whatever the URL, the check answers or refuses with its own
refusal, and what it accepts is what the connecting library would reach, at an allowed address.

DNS here is a stand-in (the names are random and the test runs offline): a name resolves, by its hash, to one or
two addresses of a pool mixing public and internal ones, IPv4 and IPv6.
"""

import hashlib
import ipaddress
import socket
from unittest.mock import patch

import pytest
import requests
from django.test import override_settings
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from urllib3.util import parse_url

from controlplane.outbound import DEFAULT_PORTS, OutboundRefused, check_url

FUZZ = hypothesis_settings(
    max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)
POOL = [
    "93.184.215.14",
    "8.8.8.8",
    "1.1.1.1",
    "9.9.9.9",
    "2606:4700:4700::1111",
    "10.0.0.1",
    "10.200.3.4",
    "127.0.0.1",
    "169.254.169.254",
    "100.64.1.1",
    "224.0.0.5",
    "2001:4860:4860::8888",
    "::1",
    "fe80::1",
    "::ffff:10.0.0.1",
    "2002:a9fe:a9fe::1",
    "64:ff9b::7f00:1",
]


def stand_in_dns(host, port, *args, **kwargs):
    """The addresses a name resolves to here: one or two of POOL, chosen by the name's hash."""
    if not isinstance(host, str) or not host or not host.isascii():
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:  # check_url never asks for a literal; if it did, answer as the system would
        raise AssertionError(f"an address was looked up as a name: {host}")
    digest = hashlib.sha256(host.encode()).digest()
    if digest[0] % 7 == 0:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    chosen = [POOL[digest[1] % len(POOL)]] + ([POOL[digest[2] % len(POOL)]] if digest[3] % 2 else [])
    return [
        (
            socket.AF_INET6 if ":" in address else socket.AF_INET,
            socket.SOCK_STREAM,
            socket.IPPROTO_TCP,
            "",
            (address, port),
        )
        for address in chosen
    ]


def public(address, allowed) -> bool:
    """An oracle written apart from the checker: a global unicast address, whatever it carries global too, or one
    in an allowed range (never unspecified or multicast)."""
    if address.is_unspecified or address.is_multicast:
        return False
    carried = []
    if address.version == 6:
        carried = [a for a in (address.ipv4_mapped, address.sixtofour) if a is not None]
        if address.teredo:
            carried.append(address.teredo[1])
        if address in ipaddress.ip_network("64:ff9b::/96"):
            carried.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    if not all(public(inner, allowed) for inner in carried):
        return False
    if any(address in ipaddress.ip_network(network) for network in allowed):
        return True
    return address.is_global and not address.is_private and not address.is_reserved


octet = st.integers(0, 255)
ipv4 = st.tuples(octet, octet, octet, octet).map(lambda parts: ".".join(map(str, parts)))
odd_ipv4 = st.one_of(
    st.integers(0, 2**32 - 1).map(str),  # decimal
    st.integers(0, 2**32 - 1).map(hex),
    st.tuples(octet, st.integers(0, 2**24 - 1)).map(lambda p: f"{p[0]}.{p[1]}"),
    st.tuples(octet, octet, octet, octet).map(lambda p: ".".join(f"0{n:o}" for n in p)),
    ipv4.map(lambda a: a + "."),
)
ipv6 = st.one_of(
    st.integers(0, 2**128 - 1).map(lambda n: f"[{ipaddress.IPv6Address(n)}]"),
    st.sampled_from(POOL).filter(lambda a: ":" in a).map(lambda a: f"[{a}]"),
    ipv4.map(lambda a: f"[::ffff:{a}]"),
    st.sampled_from(["[fe80::1%25eth0]", "[::1", "[::g]", "[]"]),
)
label = st.text(alphabet="abcxyz019-_", min_size=1, max_size=12)
names = st.one_of(
    st.lists(label, min_size=1, max_size=4).map(".".join),
    st.sampled_from(["localhost", "LocalHost", "a.localhost", "example.com.", "xn--bcher-kva.example"]),
    st.text(alphabet="aöß例.-", min_size=1, max_size=12),
)
hosts = st.one_of(ipv4, odd_ipv4, ipv6, names, st.text(max_size=20))
noise = st.text(alphabet="/\\@:%?#.a1 \t\x00é[]", max_size=12)


@st.composite
def urls(draw):
    """Mostly URLs that might pass (to see what is accepted), some with every kind of trouble."""
    hostile = draw(st.integers(0, 3)) == 0
    schemes = (
        ["http", "https", "HTTP", "oci", "ftp", "", "javascript"] if hostile else ["http", "https", "HTTPS"]
    )
    scheme = draw(st.sampled_from(schemes))
    userinfo = draw(st.sampled_from(["", "user@", "u:p@", ":@", "a\\@"])) if hostile else ""
    host = draw(hosts if hostile else st.one_of(ipv4, names, ipv6, odd_ipv4))
    ports = st.integers(0, 70000) if hostile else st.integers(1, 65535)
    port = draw(
        st.one_of(st.just(""), ports.map(lambda n: f":{n}"), st.just(":") if hostile else st.just(""))
    )
    path = draw(noise) if hostile else draw(st.sampled_from(["", "/", "/hook", "/a/b?c=d#e", "/%41"]))
    return f"{scheme}://{userinfo}{host}{port}{path}"


def connected_host(url: str):
    """Where requests would connect for ``url``: the host of the URL it prepares, as urllib3 parses it."""
    prepared = requests.PreparedRequest()
    prepared.prepare_url(url, None)
    parsed = parse_url(prepared.url)
    return parsed.host, parsed.port


@pytest.mark.parametrize("allowed", [[], ["10.0.0.0/8", "::1/128"]])
@FUZZ
@given(url=st.one_of(urls(), st.text(max_size=60)))
def test_the_check_refuses_or_accepts_only_what_is_connected_to_at_an_allowed_address(allowed, url):
    with (
        override_settings(OUTBOUND_ALLOWED_NETWORKS=allowed),
        patch.object(socket, "getaddrinfo", stand_in_dns),
    ):
        try:
            form = check_url(url, resolve=False)
        except OutboundRefused:
            form = None
        try:
            target = check_url(url)
        except OutboundRefused:
            return
    assert form is not None, "accepted when resolved, refused for its form"
    assert target.addresses, "accepted with nothing to connect to"
    for address in target.addresses:
        assert public(address, allowed), (url, address)
    host, port = connected_host(url)
    assert host.strip("[]").lower() == target.host, (url, host, target.host)
    assert (port or DEFAULT_PORTS[target.scheme]) == target.port
    if target.literal:
        assert target.addresses == (ipaddress.ip_address(target.host),)
    elif target.host == "localhost" or target.host.endswith(".localhost"):
        assert allowed  # only a provider's range lets loopback through
    else:
        expected = {ipaddress.ip_address(info[4][0]) for info in stand_in_dns(target.host, target.port)}
        assert set(target.addresses) == expected
    assert "\\" not in url and parse_url(url).auth is None
