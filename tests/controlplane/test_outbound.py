"""Outbound URLs (issue 54, M): checked once, by the parser that connects, and connected to as checked.

The report: ``http://127.0.0.1:8251\\@8.8.8.8/hook`` was checked as host 8.8.8.8 (urlsplit) and delivered to
127.0.0.1:8251 (requests). Every receiver here is a real HTTP server on a loopback address and a port the kernel
picks; a refused URL must reach none of them.
"""

import ipaddress
import socket

import pytest
import requests

from controlplane.outbound import OutboundRefused, check_url, outbound_post, outbound_session
from tests.support.outbound import CertificateAuthority, Receiver
from tests.support.processes import manage_py


@pytest.fixture
def receiver():
    running = Receiver()
    yield running
    running.close()


@pytest.fixture
def nothing_allowed(settings):
    settings.OUTBOUND_ALLOWED_NETWORKS = []


@pytest.fixture
def loopback_allowed(settings):
    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.1/32"]


def test_the_reports_backslash_url_is_refused_and_reaches_nothing(receiver, settings):
    url = f"http://127.0.0.1:{receiver.port}\\@8.8.8.8/hook"
    for allowed in ([], ["127.0.0.1/32"]):  # refused for its form, whatever ranges are allowed
        settings.OUTBOUND_ALLOWED_NETWORKS = allowed
        with pytest.raises(OutboundRefused, match="backslash"):
            check_url(url, resolve=False)
        with pytest.raises(OutboundRefused, match="backslash"):
            outbound_post(url, json={"x": 1}, timeout=2)
    assert receiver.seen == []


@pytest.mark.parametrize(
    "url, words",
    [
        ("http://user:secret@example.com/hook", "user name or password"),
        ("http://example.com@8.8.8.8/hook", "user name or password"),
        ("http://:@8.8.8.8/hook", "user name or password"),
        ("http://2130706433/hook", "dotted-decimal"),  # 127.0.0.1 in decimal
        ("http://0x7f.1/hook", "dotted-decimal"),  # in hex, two parts
        ("http://0177.0.0.1/hook", "dotted-decimal"),  # in octal
        ("http://127.1/hook", "dotted-decimal"),
        ("http://1.2.3.4.5/hook", "dotted-decimal"),
        ("http://%31%32%37.0.0.1/hook", "percent-escapes"),
        ("http://[fe80::1%25eth0]/hook", "IPv6 zone"),
        ("http://example.com./hook", "trailing dot"),
        ("http://127.0.0.1./hook", "trailing dot"),
        ("http://exa mple.com/hook", "spaces or control characters"),
        ("http://example.com/ho\nok", "spaces or control characters"),
        ("http://-bad-.example/hook", "not a valid host name"),
        ("http://a..b/hook", "not a valid host name"),
        ("http://example.com:0/hook", "port between 1 and 65535"),
        ("http://example.com:99999/hook", "not a valid URL"),
        ("http:///hook", "not a valid URL"),
        ("gopher://example.com/", "http:// or https://"),
        ("file:///etc/passwd", "http:// or https://"),
        ("", "URL is required"),
        ("https://" + "a" * 2100 + ".example/", "at most 2048"),
    ],
)
def test_urls_of_doubtful_form_are_refused(url, words):
    with pytest.raises(OutboundRefused, match=words):
        check_url(url, resolve=False)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/hook",
        "http://127.9.9.9/hook",
        "http://[::1]/hook",
        "http://[::ffff:127.0.0.1]/hook",  # v4-mapped
        "http://[::ffff:a9fe:a9fe]/latest/meta-data",  # v4-mapped metadata
        "http://[2002:7f00:1::]/hook",  # 6to4 of 127.0.0.1
        "http://[2002:a00:1::]/hook",  # 6to4 of 10.0.0.1
        "http://[64:ff9b::a9fe:a9fe]/latest/meta-data",  # NAT64 of the metadata service
        "http://169.254.169.254/latest/meta-data",
        "http://[fe80::1]/hook",
        "http://10.1.2.3/hook",
        "http://172.16.0.1/hook",
        "http://192.168.0.9/hook",
        "http://100.64.0.1/hook",  # shared address space (carrier-grade NAT)
        "http://[fc00::1]/hook",
        "http://[fec0::1]/hook",  # site-local
        "http://0.0.0.0/hook",
        "http://[::]/hook",
        "http://224.0.0.1/hook",
        "http://[ff02::1]/hook",
        "http://240.0.0.1/hook",  # reserved
        "http://192.0.2.10/hook",  # documentation
        "http://255.255.255.255/hook",
        "http://localhost/hook",
        "http://LOCALHOST/hook",
        "http://hooks.localhost/hook",
    ],
)
def test_internal_addresses_are_refused_at_input(url, nothing_allowed):
    with pytest.raises(OutboundRefused, match="address"):
        check_url(url, resolve=False)


@pytest.mark.parametrize(
    "url, host",
    [
        ("https://93.184.215.14/hook", "93.184.215.14"),
        ("https://hooks.slack.com/services/T0/B0/x", "hooks.slack.com"),
        ("HTTPS://Hooks.Example.COM:8443/a?b=c", "hooks.example.com"),
        ("https://bücher.example/hook", "xn--bcher-kva.example"),  # IDNA, as requests sends it
        ("http://[2001:4860:4860::8888]/hook", "2001:4860:4860::8888"),
    ],
)
def test_public_urls_are_taken_in_canonical_form(url, host, nothing_allowed):
    target = check_url(url, resolve=False)
    assert target.host == host


def test_a_range_the_provider_allows_is_taken_but_never_the_unspecified_address(settings):
    settings.OUTBOUND_ALLOWED_NETWORKS = ["10.20.0.0/16", "0.0.0.0/0"]
    assert check_url("http://10.20.3.4/hook", resolve=False).addresses == (ipaddress.ip_address("10.20.3.4"),)
    with pytest.raises(OutboundRefused, match="unspecified"):
        check_url("http://0.0.0.0/hook", resolve=False)
    with pytest.raises(OutboundRefused, match="multicast"):
        check_url("http://224.0.0.1/hook", resolve=False)


def test_a_name_that_resolves_to_loopback_is_refused_when_fetched(receiver, nothing_allowed):
    """At input a name is not looked up; when it is fetched, each address it resolves to is checked."""
    with pytest.raises(OutboundRefused, match="resolves|is 127.0.0.1"):
        outbound_post(receiver.url("localhost"), json={}, timeout=2)
    assert receiver.seen == []


class RebindingResolver:
    """A DNS that answers ``first`` for ``name`` once, then ``later`` (DNS rebinding); other names as the system
    does. It counts the questions for ``name``."""

    def __init__(self, name, first, later):
        self.name, self.first, self.later, self.asked = name, first, later, 0
        self.system = socket.getaddrinfo

    def __call__(self, host, port, *args, **kwargs):
        if host != self.name:
            return self.system(host, port, *args, **kwargs)
        self.asked += 1
        address = self.first if self.asked == 1 else self.later
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))]


@pytest.fixture
def two_receivers():
    """One receiver on 127.0.0.1 (the "public" address the test allows) and one on 127.0.0.2 (the internal one),
    on the same port."""
    public = Receiver(address="127.0.0.1")
    internal = Receiver(address="127.0.0.2", port=public.port)
    yield public, internal
    public.close()
    internal.close()


def test_dns_rebinding_connects_to_the_address_checked(two_receivers, settings, monkeypatch):
    public, internal = two_receivers
    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.1/32"]  # stands for a public address here
    url = public.url("rebind.test")

    # What the previous code did — check the name, then let requests resolve it again — reaches the internal one.
    resolver = RebindingResolver("rebind.test", "127.0.0.1", "127.0.0.2")
    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    check_url(url)  # the check sees 127.0.0.1
    requests.post(url, json={"to": "internal"}, timeout=2)
    assert len(internal.seen) == 1 and public.seen == []

    # Checked once and pinned: the request goes to the address the check saw, named as the URL names it.
    resolver = RebindingResolver("rebind.test", "127.0.0.1", "127.0.0.2")
    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    answer = outbound_post(url, json={"to": "public"}, timeout=2)
    assert answer.status_code == 200
    assert resolver.asked == 1
    assert [(seen.body, seen.host) for seen in public.seen] == [
        (b'{"to": "public"}', f"rebind.test:{public.port}")
    ]
    assert len(internal.seen) == 1  # still only the earlier one


def test_a_name_that_resolves_internal_first_is_refused(two_receivers, settings, monkeypatch):
    public, internal = two_receivers
    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    monkeypatch.setattr(socket, "getaddrinfo", RebindingResolver("rebind.test", "127.0.0.2", "127.0.0.1"))
    with pytest.raises(OutboundRefused, match="rebind.test is 127.0.0.2, which is a loopback address"):
        outbound_post(public.url("rebind.test"), json={}, timeout=2)
    assert public.seen == internal.seen == []


def test_https_to_a_pinned_address_keeps_the_name_for_sni_and_verification(tmp_path, settings):
    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.1/32", "::1/128"]
    authority = CertificateAuthority(tmp_path)
    right = Receiver(tls=authority.server_context("localhost"))
    wrong = Receiver(tls=authority.server_context("someone-else.example"))
    try:
        with outbound_session() as session:
            session.verify = str(authority.path)
            answer = session.post(right.url("localhost"), json={"a": 1}, timeout=5, allow_redirects=False)
            assert answer.status_code == 200
            assert right.server_names == ["localhost"]  # SNI carries the name, not the address connected to
            assert right.seen[0].host == f"localhost:{right.port}"
            with pytest.raises(requests.exceptions.SSLError, match="localhost"):
                session.post(wrong.url("localhost"), json={}, timeout=5)  # the certificate is checked by name
            with pytest.raises(requests.exceptions.SSLError):
                session.post(right.url("127.0.0.1"), json={}, timeout=5)  # no certificate for the address
        assert wrong.seen == [] and len(right.seen) == 1
    finally:
        right.close()
        wrong.close()


def test_redirects_are_not_followed(two_receivers, settings):
    public, internal = two_receivers
    settings.OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.1/32"]
    public.status, public.headers = 307, {"Location": internal.url()}
    answer = outbound_post(public.url(), json={}, timeout=2)
    assert answer.status_code == 307 and len(public.seen) == 1 and internal.seen == []
    with outbound_session() as session:  # a caller that asks to follow gets the same check on the next hop
        with pytest.raises(OutboundRefused, match="127.0.0.2"):
            session.post(public.url(), json={}, timeout=2, allow_redirects=True)
    assert internal.seen == []


def test_proxies_from_the_environment_are_not_used(receiver, loopback_allowed, monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://192.0.2.1:3128")  # a proxy would resolve the name itself
    assert outbound_post(receiver.url(), json={}, timeout=2).status_code == 200
    assert len(receiver.seen) == 1


@pytest.mark.django_db
def test_an_add_on_repository_at_the_metadata_service_is_refused(api, users, nothing_allowed):
    """Issue 54 (Low): add-on repository URLs pointing at internal addresses were accepted."""
    from fleet.models import BlueprintVersion
    from tests.support.blueprints import blueprint

    bp, _ = blueprint(users["operator"], "base")
    api.as_token(users["operator"])
    before = BlueprintVersion.objects.count()
    for repo in (
        "http://169.254.169.254/latest/meta-data",
        "https://10.0.0.5/charts",
        "oci://127.0.0.1:5000/charts",
        "https://admin:pw@charts.example/",
        "https://2852039166/charts",  # 169.254.169.254 in decimal
    ):
        addon = {"name": "x", "chart": "x", "version": "1.0.0", "repo": repo}
        answer = api.post(f"/api/v1/blueprints/{bp.pk}/versions/", {"addons": [addon]}, format="json")
        assert answer.status_code == 400, (repo, answer.content)
        assert "addons[0].repo" in answer.json(), answer.json()
    assert "169.254.169.254 is a link-local address" in str(
        api.post(
            f"/api/v1/blueprints/{bp.pk}/versions/",
            {"addons": [{"name": "x", "chart": "x", "version": "1.0.0", "repo": "http://169.254.169.254/x"}]},
            format="json",
        ).json()
    )
    assert BlueprintVersion.objects.count() == before
    fine = {"name": "x", "chart": "x", "version": "1.0.0", "repo": "oci://registry.example/charts"}
    assert (
        api.post(f"/api/v1/blueprints/{bp.pk}/versions/", {"addons": [fine]}, format="json").status_code
        == 201
    )


def test_a_range_written_wrong_stops_the_start():
    env = {
        "PATH": "/usr/bin:/bin",
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "DEBUG": "true",
        "SECRET_KEY": "x",
        "LOCAL_ENV_FILE": "",
        "DATABASE_URL": "sqlite:///:memory:",
        "OUTBOUND_ALLOWED_NETWORKS": "10.0.0.0/8, 10.1.2.3/8",
    }
    result = manage_py("check", env=env)
    assert (
        result.returncode != 0 and "OUTBOUND_ALLOWED_NETWORKS: 10.1.2.3/8 has host bits set" in result.stderr
    )


@pytest.mark.django_db
def test_an_add_on_repository_that_resolves_inside_is_refused_before_helm_runs(nothing_allowed, monkeypatch):
    """The repository is checked again when the add-on is applied: the name may resolve inside by then. (Helm is a
    recorder here: the binary does not exist where Lockstep is tested.)"""
    from fleet.drivers import DriverError
    from fleet.drivers.kubernetes import CommandResult, KubernetesDriver
    from tests.support.factories import make_cluster

    commands = []

    def helm(args, stdin, timeout):
        commands.append(args)
        return CommandResult(0, "{}", "")

    driver = KubernetesDriver(make_cluster(driver="kubernetes", connection={"kubeconfig": "/k"}), runner=helm)
    addon = {"name": "op", "chart": "op", "version": "1.0.0", "namespace": "op", "values": {}}
    monkeypatch.setattr(socket, "getaddrinfo", RebindingResolver("charts.test", "169.254.169.254", "8.8.8.8"))
    with pytest.raises(DriverError, match="repository refused: charts.test is 169.254.169.254"):
        driver.apply_addon({**addon, "repo": "https://charts.test/stable"})
    assert commands == []
    driver.apply_addon({**addon, "repo": "oci://charts.test/stable"})  # now it answers a public address
    driver.apply_addon({**addon, "repo": "oci://registry.invalid/stable"})  # unresolved: helm's to report
    assert len(commands) == 2
