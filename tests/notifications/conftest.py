"""Notifications' fixtures: a sealing key, a loopback webhook receiver, a controlled resolver."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from cryptography.fernet import Fernet

from apps.core import outbound
from apps.notifications import services

#: what the fake resolver answers for names (tests never depend on real DNS)
PUBLIC = "93.184.216.34"


@pytest.fixture(autouse=True)
def sealing_key(settings):
    settings.GRIDGATE_CREDENTIALS_KEY = [Fernet.generate_key().decode()]


@pytest.fixture(autouse=True)
def resolver(monkeypatch):
    """``resolver["hooks.example.org"] = ["10.0.0.1"]``: what a name resolves to (default: one
    public address)."""
    answers: dict[str, list[str]] = {}

    def getaddrinfo(host, port):
        return answers.get(host, [PUBLIC])

    monkeypatch.setattr(outbound, "_getaddrinfo", getaddrinfo)
    return answers


@pytest.fixture
def owner_with_email(owner):
    owner.email = "owner@example.org"
    owner.save(update_fields=["email"])
    return owner


class Receiver:
    """A webhook receiver on 127.0.0.1 (ephemeral port) that records every request and answers
    with the next code of ``codes`` (then 200)."""

    def __init__(self):
        self.requests: list[dict] = []
        self.codes: list[int] = []
        self.location = ""  # sent as Location with every answer when set (a redirect)
        self.drip = False  # answer one header line every half second, for ten seconds
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.requests.append({"headers": dict(self.headers), "body": body, "path": self.path})
                if receiver.drip:
                    try:
                        self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                        for i in range(20):
                            self.wfile.write(b"X-Pad-%d: x\r\n" % i)
                            self.wfile.flush()
                            time.sleep(0.5)
                    except OSError:
                        pass  # the client hung up: what the test expects
                    self.close_connection = True
                    return
                code = receiver.codes.pop(0) if receiver.codes else 200
                self.send_response(code)
                if receiver.location:
                    self.send_header("Location", receiver.location)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def payloads(self) -> list[dict]:
        return [json.loads(r["body"]) for r in self.requests]

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def loopback_allowed(settings):
    """The operator's exception for this test only: http, and the loopback network."""
    settings.GRIDGATE_ALLOW_INSECURE_REMOTES = True
    settings.GRIDGATE_OUTBOUND_ALLOWED_NETWORKS = ["127.0.0.0/8"]


@pytest.fixture
def receiver(loopback_allowed):
    double = Receiver()
    yield double
    double.stop()


@pytest.fixture
def subscribe():
    def make(user, event, channel="email", url=""):
        return services.create_subscription(user=user, event=event, channel=channel, url=url)

    return make
