"""Where the service itself may send a request: the outbound rules (docs/operations.md, "Notifications").

One copy of the rules for every URL a user or an operator gives the service to call:

- **scheme**: https, or http too when the operator sets ``GRIDGATE_ALLOW_INSECURE_REMOTES``
  (providers' URLs in pools' ``remote``, :mod:`apps.resources.remote`, and users' webhooks);
- **address** (users' webhooks, :mod:`apps.notifications`): never an address a case's egress
  filter drops (:data:`apps.backends.privileged.BLOCKED_V4` / ``BLOCKED_V6``: loopback, private,
  CGNAT, link-local with the cloud metadata service, multicast) nor one of this host's own, unless
  it lies in ``GRIDGATE_OUTBOUND_ALLOWED_NETWORKS`` (the operator's exceptions, CIDRs). Every
  address a name resolves to must pass, and the caller connects to one of *those* addresses
  (:func:`resolve`), so a name that resolves to a public address when checked and to 127.0.0.1
  when connected (DNS rebinding) never reaches the loopback.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

from apps.core.text import has_control_characters


class OutboundRefused(ValueError):
    """A URL the outbound rules refuse; the message says why (it names the host, never a secret)."""


def check_url(value) -> str:
    """The scheme rule (and a host, no control characters): returns ``value`` or raises
    :class:`OutboundRefused`. No name resolution (:func:`resolve` does that)."""
    if not isinstance(value, str) or not value:
        raise OutboundRefused("must be a URL")
    if has_control_characters(value):
        raise OutboundRefused("must not contain control characters (newlines, tabs…)")
    try:
        parsed = urlsplit(value)
    except ValueError:  # "https://[::1/x": an unclosed bracket, a bracketed name that is no IPv6 address
        raise OutboundRefused("is not a valid URL") from None
    allowed = {"https", "http"} if settings.GRIDGATE_ALLOW_INSECURE_REMOTES else {"https"}
    if parsed.scheme not in allowed or not parsed.netloc:
        if parsed.scheme == "http":
            raise OutboundRefused(
                "must be an https URL (http is only allowed with GRIDGATE_ALLOW_INSECURE_REMOTES=true)"
            )
        raise OutboundRefused("must be an https URL")
    return value


def _networks(items) -> list:
    return [ipaddress.ip_network(item, strict=False) for item in items]


_OWN: tuple[float, list] = (0.0, [])
OWN_ADDRESSES_SECONDS = 60.0


def _own_addresses() -> list:
    """This host's own addresses (as the egress filter reads them), re-read once a minute."""
    global _OWN
    from apps.backends.privileged import host_addresses

    read_at, addresses = _OWN
    if time.monotonic() - read_at > OWN_ADDRESSES_SECONDS:
        v4, v6 = host_addresses()
        addresses = [ipaddress.ip_address(item) for item in [*v4, *v6]]
        _OWN = (time.monotonic(), addresses)
    return addresses


#: RFC 6052's well-known NAT64 prefix: its last 32 bits are the IPv4 address a NAT64 gateway
#: connects to. The local-use prefix (64:ff9b:1::/48, RFC 8215) and a site's own prefix place the
#: address by the site's prefix length, which is not known here: they are not globally reachable,
#: and refused as such.
NAT64 = ipaddress.ip_network("64:ff9b::/96")
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


def carried_ipv4(ip) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for on its way (NAT64, 6to4, IPv4-compatible), or
    None. Behind a NAT64 gateway (an IPv6-only cloud subnet) ``64:ff9b::a00:5`` *is* 10.0.0.5:
    checking the IPv6 address alone would let a webhook reach the site's private network."""
    if ip.version != 6:
        return None
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in IPV4_COMPATIBLE:
        return ipaddress.IPv4Address(int(ip))
    return None


def address_problem(address: str) -> str | None:
    """Why the service must not connect to ``address`` (None when it may)."""
    from apps.backends.privileged import BLOCKED_V4, BLOCKED_V6

    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if ip.version == 6 and ip.ipv4_mapped is not None:  # ::ffff:127.0.0.1 is 127.0.0.1
        ip = ip.ipv4_mapped
    if any(ip in network for network in _networks(settings.GRIDGATE_OUTBOUND_ALLOWED_NETWORKS)):
        return None
    if any(ip in network for network in _networks(BLOCKED_V4 + BLOCKED_V6)):
        return f"{ip} is a loopback, private, link-local or reserved address"
    carried = carried_ipv4(ip)
    if carried is not None:
        problem = address_problem(str(carried))
        return f"{ip} leads to {carried}: {problem}" if problem else None
    if not ip.is_global:  # the special-purpose registries: benchmarking, protocol assignments, Teredo…
        return f"{ip} is not a globally reachable address"
    if ip in _own_addresses():
        return f"{ip} is an address of this host"
    return None


def _getaddrinfo(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to (a test replaces this: no test depends on real DNS)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({info[4][0] for info in infos})


@dataclass(frozen=True)
class Target:
    """A checked URL: connect to ``address`` (resolved and checked now), present ``host``."""

    scheme: str
    host: str
    port: int
    address: str
    path: str  # path and query, as the URL gave them

    @property
    def connect_url(self) -> str:
        """The URL with the checked address in place of the name (the caller sends ``Host`` and
        TLS SNI as ``host``, so certificates are verified against the name)."""
        ip = f"[{self.address}]" if ":" in self.address else self.address
        return f"{self.scheme}://{ip}:{self.port}{self.path}"

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        name = f"[{self.host}]" if ":" in self.host else self.host
        return name if self.port == default else f"{name}:{self.port}"


def resolve(url: str) -> Target:
    """Check ``url`` against every rule, resolving its name now; raise :class:`OutboundRefused`.

    Every address the name resolves to must be allowed (a name with one private address among
    public ones is refused: which one a client picks is not ours to know)."""
    check_url(url)
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise OutboundRefused("has an invalid port") from None
    if parts.username or parts.password:
        raise OutboundRefused("must not carry a user name or password")
    try:
        addresses = [str(ipaddress.ip_address(host))]
    except ValueError:
        try:
            addresses = _getaddrinfo(host, port)
        except (OSError, UnicodeError):
            raise OutboundRefused(f"{host} cannot be resolved") from None
    if not addresses:
        raise OutboundRefused(f"{host} cannot be resolved")
    for address in addresses:
        problem = address_problem(address)
        if problem:
            raise OutboundRefused(f"{host} is not allowed: {problem} (GRIDGATE_OUTBOUND_ALLOWED_NETWORKS)")
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return Target(parts.scheme, host, port, addresses[0], path)
