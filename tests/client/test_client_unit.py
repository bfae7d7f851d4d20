"""The client's own rules, against HTTP doubles (httpx.MockTransport): polling with back-off that
honours Retry-After, which requests are retried, the device grant's polling (RFC 8628), and where
tokens are kept. No server, no database, no sleeping: every wait is recorded instead."""

import json
import stat

import httpx
import pytest
from gridgate_client import config, devicegrant
from gridgate_client.api import Client, GridgateError, TimedOut


class Clock:
    def __init__(self):
        self.now = 0.0
        self.slept = []

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds

    def __call__(self):
        return self.now


def client_with(handler, clock=None) -> Client:
    clock = clock or Clock()
    return Client("http://gridgate.test", "tok", transport=httpx.MockTransport(handler), sleep=clock.sleep, clock=clock)


def test_a_503_is_retried_after_the_servers_retry_after():
    clock, answers = Clock(), iter([httpx.Response(503, headers={"Retry-After": "7"}, json={"detail": "busy"})])

    def handler(request):
        return next(answers, httpx.Response(200, json={"id": 1, "status": "pending"}))

    assert client_with(handler, clock).job(1)["id"] == 1
    assert clock.slept == [7.0]


def test_a_write_without_an_idempotency_key_is_not_retried():
    calls = []

    def handler(request):
        calls.append(request)
        return httpx.Response(503, headers={"Retry-After": "1"}, json={"detail": "Database busy."})

    with pytest.raises(GridgateError) as caught:
        client_with(handler).cancel_job(3)
    assert (len(calls), caught.value.status, caught.value.detail) == (1, 503, "Database busy.")


def test_a_submission_carries_an_idempotency_key_and_is_retried_with_the_same_one():
    keys = []

    def handler(request):
        keys.append(request.headers["Idempotency-Key"])
        if len(keys) == 1:
            return httpx.Response(429, headers={"Retry-After": "2"}, json={"detail": "slow down"})
        return httpx.Response(201, json={"id": 9})

    assert client_with(handler).submit_job("s", {"sequence": "{}"}, 10)["id"] == 9
    assert len(keys) == 2 and keys[0] == keys[1]


def test_waiting_backs_off_and_starts_again_when_the_status_moves():
    clock = Clock()
    statuses = iter(["pending"] * 4 + ["running"] * 2 + ["completed"])

    def handler(request):
        return httpx.Response(200, json={"id": 1, "status": next(statuses)})

    assert client_with(handler, clock).wait_job(1)["status"] == "completed"
    assert clock.slept == [0.5, 1.0, 2.0, 4.0, 0.5, 1.0]


def test_a_wait_stops_at_its_deadline():
    clock = Clock()

    def handler(request):
        return httpx.Response(200, json={"id": 1, "status": "pending"})

    with pytest.raises(TimedOut) as caught:
        client_with(handler, clock).wait_job(1, timeout=3)
    assert caught.value.last["status"] == "pending"
    assert sum(clock.slept) == 3


def test_field_errors_read_as_words():
    def handler(request):
        return httpx.Response(400, json={"shots": ["Ensure this value is greater than or equal to 1."]})

    with pytest.raises(GridgateError) as caught:
        client_with(handler).submit_job("s", {}, 0)
    assert caught.value.detail == "shots: Ensure this value is greater than or equal to 1."


def test_device_grant_polls_at_the_interval_and_slows_down_when_asked():
    clock = Clock()
    polls = iter(
        [
            httpx.Response(400, json={"error": "authorization_pending"}),
            httpx.Response(400, json={"error": "slow_down"}),
            httpx.Response(200, json={"access_token": "a.b.c", "refresh_token": "r", "expires_in": 300}),
        ]
    )
    shown = []

    def handler(request):
        if request.url.path.endswith("openid-configuration"):
            return httpx.Response(
                200,
                json={
                    "device_authorization_endpoint": "https://idp.test/device",
                    "token_endpoint": "https://idp.test/token",
                    "revocation_endpoint": "https://idp.test/revoke",
                },
            )
        if request.url.path == "/device":
            return httpx.Response(
                200,
                json={
                    "device_code": "d",
                    "user_code": "ABCD-EFGH",
                    "verification_uri": "https://idp.test/go",
                    "interval": 5,
                },
            )
        assert b"device_code=d" in request.content
        return next(polls)

    with httpx.Client(transport=httpx.MockTransport(handler)) as http:
        tokens = devicegrant.device_login(
            {"issuer": "https://idp.test", "client_id": "gridgate-cli"},
            http=http,
            show=lambda *args: shown.append(args),
            sleep=clock.sleep,
            clock=clock,
        )

    assert tokens["access_token"] == "a.b.c" and tokens["client_id"] == "gridgate-cli"
    assert tokens["revocation_endpoint"] == "https://idp.test/revoke"  # for logout
    assert shown == [("https://idp.test/go", "ABCD-EFGH", None)]
    assert clock.slept == [5.0, 5.0, 10.0]


def test_a_provider_without_the_device_grant_is_told_plainly():
    def handler(request):
        return httpx.Response(200, json={"token_endpoint": "https://idp.test/token"})

    with httpx.Client(transport=httpx.MockTransport(handler)) as http, pytest.raises(GridgateError) as caught:
        devicegrant.discover(http, "https://idp.test")
    assert "does not offer sign-in from a terminal" in caught.value.detail


def test_tokens_are_kept_0600_per_server_and_the_environment_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("GRIDGATE_TOKEN", raising=False)
    monkeypatch.delenv("GRIDGATE_URL", raising=False)

    path = config.store_token("https://grid.example.org/", "secret-token")

    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert json.loads(path.read_text())["default_url"] == "https://grid.example.org"
    assert config.resolve_url() == "https://grid.example.org"
    assert config.resolve_token("https://grid.example.org") == "secret-token"
    assert config.resolve_token("https://other.example.org") == ""
    monkeypatch.setenv("GRIDGATE_TOKEN", "from-env")
    monkeypatch.setenv("GRIDGATE_URL", "http://localhost:9000")
    assert (config.resolve_url(), config.resolve_token("https://grid.example.org")) == (
        "http://localhost:9000",
        "from-env",
    )


@pytest.mark.parametrize(
    ("given", "used"),
    [
        ("grid.example.org", "https://grid.example.org"),
        ("alice@grid.example.org:8443/", "https://alice@grid.example.org:8443"),
        ("127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("localhost:8000", "http://localhost:8000"),
        ("[::1]:8000", "http://[::1]:8000"),
        ("http://grid.example.org", "http://grid.example.org"),
        ("HTTPS://Alice@Grid.Example.ORG/Gridgate/", "https://Alice@grid.example.org/Gridgate"),
        ("Grid.Example.org", "https://grid.example.org"),
    ],
)
def test_a_site_named_without_a_scheme_is_reached_over_https_unless_it_is_this_machine_and_in_lower_case(given, used):
    assert config.normalize(given) == used


def test_a_token_kept_for_a_sites_plain_http_address_is_named_when_its_https_address_has_none(
    tmp_path, monkeypatch, capsys
):
    """A login that named the site bare kept its token under ``http://`` before a bare name meant
    https: the https address finds no token, and the refusal says where the old one is."""
    from gridgate_client import cli

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("GRIDGATE_TOKEN", raising=False)
    monkeypatch.delenv("GRIDGATE_URL", raising=False)
    config.store_token("http://grid.example.org", "old-token")

    assert cli.main(["--url", "grid.example.org", "session", "list"]) == cli.EXIT_AUTH
    said = capsys.readouterr().err
    assert "not logged in to https://grid.example.org" in said and "http://grid.example.org's" in said
    assert "old-token" not in said
    assert cli.main(["--url", "other.example.org", "session", "list"]) == cli.EXIT_AUTH
    assert "http://" not in capsys.readouterr().err


def test_a_password_login_to_a_bare_site_name_never_goes_in_clear():
    seen = []

    def handler(request):
        seen.append(request.url.scheme)
        return httpx.Response(200, json={"token": "t", "expires_at": None})

    Client("grid.example.org", "", transport=httpx.MockTransport(handler)).password_login("alice", "pw")
    assert seen == ["https"]


NGINX_502 = (
    "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
    "<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
)


@pytest.mark.parametrize("status", [502, 504])
def test_a_proxys_bad_gateway_or_gateway_timeout_is_retried_when_the_request_may_be_repeated(status):
    """A proxy answers 502/504 while the site restarts or a worker is slow: a read (and a write
    with an Idempotency-Key) is tried again, as for a 503; a long wait is not cut by one."""
    clock = Clock()
    answers = iter([httpx.Response(status, headers={"Content-Type": "text/html"}, text=NGINX_502)])

    def handler(request):
        return next(answers, httpx.Response(200, json={"id": 1, "status": "pending"}))

    assert client_with(handler, clock).job(1)["id"] == 1
    assert clock.slept == [1.0]


def test_a_proxys_error_page_is_told_in_one_line_by_its_title_not_as_html():
    calls = []

    def handler(request):
        calls.append(request)
        return httpx.Response(502, headers={"Content-Type": "text/html"}, text=NGINX_502)

    with pytest.raises(GridgateError) as caught:
        client_with(handler).cancel_job(3)  # a write without a key: not retried

    assert len(calls) == 1
    assert caught.value.status == 502
    assert caught.value.detail == (
        "HTTP 502 Bad Gateway from gridgate.test, not Gridgate's answer (502 Bad Gateway): "
        "the site, or a proxy in front of it, is failing: try again later"
    )


def test_an_error_page_without_a_title_is_told_by_its_text():
    def handler(request):
        return httpx.Response(
            404, headers={"Content-Type": "text/html"}, text="<body><p>No&nbsp;such\n page</p></body>"
        )

    with pytest.raises(GridgateError) as caught:
        client_with(handler).job(1)

    assert (
        caught.value.detail
        == "HTTP 404 Not Found from gridgate.test, not Gridgate's answer (No such page): is the URL Gridgate's?"
    )


def test_each_retry_is_told_with_its_reason_and_when_the_next_try_is():
    """Five tries of a server that does not answer take minutes: each is said, not a silent hang."""
    answers = iter(
        [
            httpx.Response(503, headers={"Retry-After": "7"}, json={"detail": "busy"}),
            httpx.ConnectTimeout("timed out"),
        ]
    )

    def handler(request):
        answer = next(answers, None)
        if isinstance(answer, Exception):
            raise answer
        return answer or httpx.Response(200, json={"id": 1, "status": "pending"})

    api = client_with(handler)
    told = []
    api.on_retry = told.append

    assert api.job(1)["id"] == 1
    assert told == [
        "gridgate.test answered HTTP 503 Service Unavailable; trying again in 7 s (try 2 of 5)",
        "cannot reach gridgate.test (no answer in time: timed out); trying again in 2 s (try 3 of 5)",
    ]


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("ftp://grid.example.org", "is not a site's address"),
        ("file:///etc/passwd", "is not a site's address"),
        ("http://", "names no site"),
        ("https:///api", "names no site"),
        ("http://grid.example.org:99999", "Port out of range"),
        ("https://grid example.org", "a space in it"),
    ],
)
def test_a_site_address_that_cannot_be_one_is_refused_before_anything_is_sent(given, said):
    """It was tried five times over 15 s ('Cannot reach https://http:', an unsupported protocol),
    then exited 5, 'the server cannot be reached', for what is a typo (exit 2)."""
    with pytest.raises(config.BadURL) as caught:
        config.normalize(given)
    assert said in str(caught.value)


DEVICE_ENTRY = {"refresh_token": "r", "token_endpoint": "https://idp.test/token", "client_id": "gridgate-cli"}


@pytest.mark.parametrize(
    ("answer", "status", "said"),
    [
        (httpx.ConnectError("Connection refused"), None, "Cannot reach the identity provider"),
        (httpx.Response(400, json={"error": "invalid_grant"}), 401, "Your sign-in has ended (invalid_grant)"),
        (httpx.Response(502, text="<html>Bad Gateway</html>"), None, "cannot renew your sign-in now"),
        (httpx.Response(200, text="<html>proxy sign-in</html>"), None, "not its JSON"),
    ],
    ids=["unreachable", "refused", "provider-down", "not-json"],
)
def test_renewing_a_device_login_fails_with_an_error_not_a_traceback(answer, status, said):
    """A refused renewal is 'not logged in' (status 401: exit 4), not 'cannot be reached'."""

    def handler(request):
        if isinstance(answer, Exception):
            raise answer
        return answer

    with httpx.Client(transport=httpx.MockTransport(handler)) as http, pytest.raises(GridgateError) as caught:
        devicegrant.refresh(DEVICE_ENTRY, http=http)
    assert (caught.value.status, said in caught.value.detail) == (status, True)


def test_device_login_goes_on_polling_past_a_lost_poll_and_refuses_an_answer_that_is_not_json():
    clock = Clock()
    polls = iter([httpx.ConnectError("reset"), httpx.Response(200, json={"access_token": "a.b.c"})])
    device_answer = [httpx.Response(200, json={"device_code": "d", "user_code": "U", "verification_uri": "v"})]

    def handler(request):
        if request.url.path.endswith("openid-configuration"):
            return httpx.Response(
                200,
                json={
                    "device_authorization_endpoint": "https://idp.test/device",
                    "token_endpoint": "https://idp.test/token",
                },
            )
        if request.url.path == "/device":
            return device_answer[0]
        answer = next(polls)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def login(http):
        return devicegrant.device_login(
            {"issuer": "https://idp.test", "client_id": "c"},
            http=http,
            show=lambda *a: None,
            sleep=clock.sleep,
            clock=clock,
        )

    with httpx.Client(transport=httpx.MockTransport(handler)) as http:
        assert login(http)["access_token"] == "a.b.c"
        device_answer[0] = httpx.Response(200, text="<html>proxy</html>")
        with pytest.raises(GridgateError) as caught:
            login(http)
    assert "not its JSON" in caught.value.detail


def test_a_device_login_whose_renewal_is_refused_exits_4_saying_to_log_in_again(tmp_path, monkeypatch, capsys):
    from gridgate_client import cli

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("GRIDGATE_TOKEN", raising=False)
    monkeypatch.delenv("GRIDGATE_URL", raising=False)
    config.store_token("https://grid.example.org", "a.b.c", expires_at=0, **DEVICE_ENTRY)

    def refused(entry, *, http):
        raise GridgateError("Your sign-in has ended (invalid_grant): run gridgate login again.", status=401)

    monkeypatch.setattr(devicegrant, "refresh", refused)

    assert cli.main(["pools"]) == cli.EXIT_AUTH
    assert capsys.readouterr().err == "gridgate: Your sign-in has ended (invalid_grant): run gridgate login again.\n"


@pytest.mark.parametrize(
    ("stored", "answer", "code", "said"),
    [
        ({"revocation_endpoint": "https://idp.test/revoke"}, httpx.Response(200), 0, "the sign-in is ended"),
        ({}, None, 0, "did not revoke it"),  # a provider that names no endpoint, or an older client's login
        ({"revocation_endpoint": "https://idp.test/revoke"}, httpx.Response(400), 0, "did not revoke it"),
        ({"revocation_endpoint": "https://idp.test/revoke"}, httpx.ConnectError("refused"), 5, "could not end it"),
    ],
    ids=["revoked", "no-endpoint", "refused", "unreachable"],
)
def test_logout_of_a_device_login_revokes_its_refresh_token_at_the_provider(
    tmp_path, monkeypatch, capsys, stored, answer, code, said
):
    """The refresh token would go on minting access tokens: logout revokes it (RFC 7009) where the
    provider says how, and forgets the login here whatever the provider answers."""
    from gridgate_client import cli

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("GRIDGATE_TOKEN", raising=False)
    monkeypatch.delenv("GRIDGATE_URL", raising=False)
    config.store_token("https://grid.example.org", "a.b.c", expires_at=0, **DEVICE_ENTRY, **stored)
    renewed = {"access_token": "x.y.z", "refresh_token": "r", "expires_in": 300}
    monkeypatch.setattr(devicegrant, "refresh", lambda entry, *, http: renewed)
    cli._refresh_if_due("https://grid.example.org")  # a command renewed it first: the login keeps its endpoint
    sent = []

    def handler(request):
        sent.append((str(request.url), request.content.decode()))
        if isinstance(answer, Exception):
            raise answer
        return answer

    real_client = httpx.Client
    monkeypatch.setattr(httpx, "Client", lambda **kw: real_client(transport=httpx.MockTransport(handler), **kw))

    assert cli.main(["logout"]) == code
    out = capsys.readouterr()
    assert said in out.out + out.err
    expected = "token=r&token_type_hint=refresh_token&client_id=gridgate-cli"
    assert sent == ([("https://idp.test/revoke", expected)] if stored else [])
    assert config.forget_token("https://grid.example.org") is None  # forgotten in every case


@pytest.mark.parametrize(
    "content",
    ['{"servers": []}', '{"servers": {"https://grid.example.org": "tok"}}', "[1]", '{"default_url": 3}'],
)
def test_a_credentials_file_of_another_shape_reads_as_not_logged_in_not_a_traceback(
    tmp_path, monkeypatch, content, capsys
):
    """A file edited by hand (or by another tool) into another shape ended every command in an
    AttributeError traceback."""
    from gridgate_client import cli

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("GRIDGATE_TOKEN", raising=False)
    monkeypatch.setenv("GRIDGATE_URL", "https://grid.example.org")
    (tmp_path / "gridgate").mkdir()
    (tmp_path / "gridgate" / "credentials.json").write_text(content)

    assert cli.main(["pools"]) == cli.EXIT_AUTH
    assert capsys.readouterr().err.startswith("gridgate: not logged in to https://grid.example.org")


def test_an_answer_whose_rows_are_not_objects_is_an_error_not_a_traceback(monkeypatch, capsys):
    """pools/allocations rows read with .get(): a list of strings was an AttributeError traceback."""
    from gridgate_client import cli

    monkeypatch.setenv("GRIDGATE_TOKEN", "tok-of-alice")
    monkeypatch.setattr(Client, "pools", lambda self: ["qpu", "local"])

    assert cli.main(["--url", "https://grid.example.org", "pools"]) == cli.EXIT_UNAVAILABLE
    assert capsys.readouterr().err.startswith("gridgate: the server's answer is not what this client reads")


def test_a_token_that_does_not_expire_is_not_said_to_last_until_none(tmp_path, monkeypatch, capsys):
    from gridgate_client import cli

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("GRIDGATE_TOKEN", raising=False)
    answers = {
        "/api/v1/auth/methods/": {"password": True},
        "/api/v1/auth/token/": {"token": "t" * 40, "expires_at": None},
    }
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=answers[request.url.path]))
    real_init = Client.__init__
    monkeypatch.setattr(Client, "__init__", lambda self, *a, **k: real_init(self, *a, **{**k, "transport": transport}))
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("pw\n"))

    assert cli.main(["--url", "https://grid.example.org", "login", "-u", "alice", "--password-stdin"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Logged in to https://grid.example.org as alice (token in ") and "None" not in out


def test_a_refused_password_login_never_quotes_the_password():
    """A proxy's error page or a debugging server may echo the request's body: the error the CLI
    prints (and --json's body) has the password as ***."""

    def handler(request):
        sent = json.loads(request.content)
        return httpx.Response(400, json={"detail": f"Bad request: {sent}", "echo": [sent["password"]]})

    with pytest.raises(GridgateError) as caught:
        Client("https://grid.example.org", "", transport=httpx.MockTransport(handler)).password_login(
            "alice", "hunter2-secret"
        )
    assert "hunter2-secret" not in caught.value.detail + json.dumps(caught.value.body)
    assert "***" in caught.value.detail and caught.value.body["echo"] == ["***"]
