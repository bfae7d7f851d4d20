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
