"""An identity provider's published keys (JWKS) on loopback, and tokens signed with them: for the
bearer-token cases a real provider will not produce on demand (expired, another audience, a key
it never published, a rotated key). Counts how often its keys were read."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
from cryptography.hazmat.primitives.asymmetric import rsa


class Issuer:
    def __init__(self):
        self.keys: dict[str, rsa.RSAPrivateKey] = {}
        self.published: list[str] = []
        self.fetches = 0
        self.add_key("key-1")
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def start(self) -> "Issuer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def add_key(self, kid: str, *, publish: bool = True) -> None:
        self.keys[kid] = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        if publish:
            self.published.append(kid)

    def withdraw(self, kid: str) -> None:
        self.published.remove(kid)

    def token(
        self,
        *,
        kid: str = "key-1",
        audience: str = "gridgate-api",
        lifetime: int = 300,
        header_typ: str = "at+jwt",
        **claims,
    ) -> str:
        """An access token as RFC 9068 has them (header ``typ: at+jwt``), unless told otherwise."""
        now = int(time.time())
        body = {"iss": self.url, "aud": audience, "iat": now, "exp": now + lifetime, "sub": "user-1"} | claims
        return jwt.encode(body, self.keys[kid], algorithm="RS256", headers={"kid": kid, "typ": header_typ})

    def jwks(self) -> dict:
        keys = []
        for kid in self.published:
            key = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.keys[kid].public_key()))
            keys.append(key | {"kid": kid, "use": "sig", "alg": "RS256"})
        return {"keys": keys}

    def _handler(self):
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                if self.path != "/jwks":
                    self.send_error(404)
                    return
                issuer.fetches += 1
                body = json.dumps(issuer.jwks()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        return Handler
