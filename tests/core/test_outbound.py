"""The outbound rules (apps.core.outbound): one copy for providers' URLs and users' webhooks."""

import pytest

from apps.core import outbound


@pytest.fixture
def resolves(monkeypatch):
    answers = {}
    monkeypatch.setattr(outbound, "_getaddrinfo", lambda host, port: answers.get(host, ["93.184.216.34"]))
    return answers


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "10.0.0.1", "172.16.5.4", "192.168.1.1", "100.64.0.1", "169.254.169.254", "0.0.0.0", "::1",  # noqa: S104
     "fd00::1", "fe80::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1", "224.0.0.1"],
)  # fmt: skip
def test_loopback_private_link_local_and_mapped_addresses_are_refused(address):
    assert outbound.address_problem(address)


def test_a_public_address_passes_and_the_operators_networks_are_allowed(settings):
    assert outbound.address_problem("93.184.216.34") is None
    settings.GRIDGATE_OUTBOUND_ALLOWED_NETWORKS = ["10.1.2.3/32"]
    assert outbound.address_problem("10.1.2.3") is None
    assert outbound.address_problem("10.1.2.4")


def test_an_address_of_this_host_is_refused_even_a_public_one(monkeypatch):
    """A webhook to the host's own public address would reach what the service's host listens on."""
    from apps.backends import privileged

    monkeypatch.setattr(privileged, "host_addresses", lambda: (["93.184.216.34"], ["2606:2800:220:1::1"]))
    monkeypatch.setattr(outbound, "_OWN", (float("-inf"), []))  # read the host's addresses again
    assert "address of this host" in outbound.address_problem("93.184.216.34")
    assert "address of this host" in outbound.address_problem("2606:2800:220:1::1")
    assert outbound.address_problem("93.184.216.35") is None


def test_a_name_is_refused_when_any_of_its_addresses_is_private(resolves):
    resolves["mixed.example.org"] = ["93.184.216.34", "127.0.0.1"]
    with pytest.raises(outbound.OutboundRefused, match="127.0.0.1"):
        outbound.resolve("https://mixed.example.org/hook")
    resolves["gone.example.org"] = []
    with pytest.raises(outbound.OutboundRefused, match="cannot be resolved"):
        outbound.resolve("https://gone.example.org/hook")


def test_the_connection_goes_to_the_checked_address_under_the_url_s_name(resolves):
    resolves["hooks.example.org"] = ["2606:2800:220:1::1"]
    target = outbound.resolve("https://hooks.example.org:8443/in?x=1")
    assert target.connect_url == "https://[2606:2800:220:1::1]:8443/in?x=1"
    assert target.host_header == "hooks.example.org:8443"
    assert outbound.resolve("https://hooks.example.org/").host_header == "hooks.example.org"


@pytest.mark.parametrize(
    "url", ["http://hooks.example.org/", "ftp://hooks.example.org/", "https://", "https://a.example.org/\nx", 42]
)
def test_the_scheme_rule_is_https_unless_the_operator_allows_http(url, settings):
    with pytest.raises(outbound.OutboundRefused):
        outbound.check_url(url)
    settings.GRIDGATE_ALLOW_INSECURE_REMOTES = True
    if url == "http://hooks.example.org/":
        assert outbound.check_url(url) == url


@pytest.mark.parametrize(
    "address",
    [
        "64:ff9b::a00:1",  # NAT64 (well-known prefix) of 10.0.0.1: a NAT64 gateway connects to it
        "64:ff9b::a9fe:a9fe",  # ... of the metadata service
        "64:ff9b::7f00:1",
        "64:ff9b:1::a00:1",  # the local-use NAT64 prefix
        "64:ff9b:1::5db8:d822",  # ... whatever address its last bits hold: the site's prefix length places it
        "2002:a00:1::1",  # 6to4 of 10.0.0.1
        "2002:a9fe:a9fe::1",
        "::a00:1",  # IPv4-compatible 10.0.0.1
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",  # Teredo
        "192.0.0.192",  # IETF protocol assignments (a cloud's metadata address among them)
        "198.18.0.1",  # benchmarking, routed inside some sites
        "100::1",  # discard-only
    ],
)
def test_addresses_that_carry_or_reach_a_private_address_are_refused(address):
    assert outbound.address_problem(address)


def test_a_nat64_address_of_a_public_one_passes():
    """An IPv6-only site reaches public receivers through DNS64: their names resolve to NAT64."""
    assert outbound.address_problem("64:ff9b::5db8:d822") is None  # 93.184.216.34


def test_a_name_resolving_to_the_metadata_service_through_nat64_is_refused(resolves):
    resolves["hooks.example.org"] = ["64:ff9b::a9fe:a9fe"]
    with pytest.raises(outbound.OutboundRefused, match="169.254.169.254"):
        outbound.resolve("https://hooks.example.org/hook")
