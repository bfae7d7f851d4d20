"""The Pasqal Cloud double served through the SDK's own ``BaseMockServer``.

``pasqal_cloud.utils.mock_server.BaseMockServer`` is what pasqal-cloud ships for testing code
that uses it: requests-mock intercepts the SDK's requests in process, on the SDK's default
endpoints (``https://apis.pasqal.cloud/core-fast``) and its token route
(``https://authenticate.pasqal.cloud/oauth/token``), and hands each one to an ``endpoint_*``
method. Here those methods answer from the same ``CloudApi`` state as the loopback double, so the
driver's tests run unchanged against both: the routes the base class registers, plus the ones it
declares without registering (``GET /api/v1/batches``, ``POST /api/v2/batches/{id}/jobs``) or
does not know (``GET /api/v2/jobs/{id}``, the presigned results link).
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit

import requests
from pasqal_cloud.utils.mock_server import BaseMockServer

from tests.doubles.pasqal_cloud_server import CloudApi, jsend

TOKEN_URL = "https://authenticate.pasqal.cloud/oauth/token"
RESULTS = "https://results.pasqal.example"


class SdkMockCloud(CloudApi, BaseMockServer):
    def __init__(self, **kwargs):
        CloudApi.__init__(self, **kwargs)
        BaseMockServer.__init__(self)
        core = re.escape(self.endpoints.core)
        # Registered after the base class's, so requests-mock tries them first; anchored, since
        # it matches a URL by search.
        for method, path, view in (
            ("GET", r"/api/v1/batches(\?.*)?$", self.endpoint_get_batches),
            ("POST", r"/api/v2/batches/(?P<id>[^/?]+)/jobs$", self.endpoint_add_jobs),
            ("GET", r"/api/v2/batches/(?P<id>[^/?]+)$", self.endpoint_get_batch),
            ("GET", r"/api/v2/jobs(\?.*)?$", self.endpoint_get_jobs),
            ("GET", r"/api/v2/jobs/(?P<id>[^/?]+)$", self.endpoint_get_job),
            ("GET", re.escape(RESULTS) + r"/results/(?P<id>[^/?]+)$", self.endpoint_results),
        ):
            pattern = re.compile(path if path.startswith("https") else core + path)
            self.mocker.request(method, pattern, json=lambda r, c, view=view, p=pattern: view(r, c, p.search(r.url)))

    # -- the double's interface ----------------------------------------------------------------
    def start(self):
        self.__enter__()
        return self

    def stop(self):
        self.__exit__(None, None, None)

    def config(self, **extra) -> dict:
        """A device ``config`` on Pasqal Cloud's own endpoints (what the mock intercepts)."""
        return super().config(token_endpoint=TOKEN_URL, **extra)

    # -- requests-mock glue --------------------------------------------------------------------
    def _serve(self, request, context, route, *, signed=True):
        """Authentication and injected faults, then the route; a dropped answer is a lost
        connection after the request was carried out."""
        path = urlsplit(request.url).path
        self.calls.append((request.method, path))
        fault = None if not signed else self.take_fault(request.method, path, drop=False)
        if signed and not self.authorized(request.headers.get("Authorization")):
            body, context.status_code = jsend(None, 401, "Unauthorized")
        elif fault is not None:
            body, context.status_code = jsend(None, fault.status, f"injected fault {fault.status}")
        else:
            body, context.status_code = route()
        if self.take_fault(request.method, path, drop=True) is not None:
            raise requests.ConnectionError("Connection aborted: the answer was lost.")
        return body

    def _body(self, request):
        return self.body(request.body, request.headers.get("Content-Encoding"))

    @staticmethod
    def _arg(request, name):
        return (parse_qs(urlsplit(request.url).query).get(name) or [None])[0]

    # -- BaseMockServer's endpoints ------------------------------------------------------------
    def endpoint_post_authenticate_token(self, request, context):
        raw = request.body.decode() if isinstance(request.body, bytes) else request.body or ""
        form = {k: v[0] for k, v in parse_qs(raw).items()}
        return self._serve(request, context, lambda: self.sign_in(form), signed=False)

    def endpoint_get_devices_specs(self, request, context, matches):
        return self._serve(request, context, self.device_specs)

    def endpoint_post_batch(self, request, context, matches):
        return self._serve(request, context, lambda: self.create_batch(self._body(request)))

    def endpoint_get_batches(self, request, context, match):
        return self._serve(request, context, lambda: self.list_batches(self._arg(request, "tag")))

    def endpoint_add_jobs(self, request, context, match):
        return self._serve(request, context, lambda: self.add_jobs(match["id"], self._body(request)))

    def endpoint_get_batch(self, request, context, match):
        return self._serve(request, context, lambda: self.get_batch(match["id"]))

    def endpoint_patch_complete_batch(self, request, context, matches):
        return self._serve(request, context, lambda: self.close_batch(matches[0]))

    def endpoint_get_jobs(self, request, context, match):
        return self._serve(request, context, lambda: self.list_jobs(self._arg(request, "batch_id")))

    def endpoint_get_job(self, request, context, match):
        return self._serve(request, context, lambda: self.get_job(match["id"]))

    def endpoint_get_job_results(self, request, context, matches):
        return self._serve(request, context, lambda: self.results_link(matches[0], RESULTS))

    def endpoint_results(self, request, context, match):
        return self._serve(request, context, lambda: self.results(match["id"]), signed=False)

    def endpoint_cancel_job(self, request, context, matches):
        return self._serve(request, context, lambda: self.cancel_job(matches[0]))
