"""The Content-Security-Policy header: django-csp's middleware with the policy in settings
(`CONTENT_SECURITY_POLICY`), plus this host's websocket origin in `connect-src`.

CSP3 lets `'self'` match `ws:`/`wss:` on the page's own host, which is what the live pages'
websockets (static/js/run-live.js) use; Safari before 16 did not, so the origin is also named explicitly.
"""

from __future__ import annotations

from csp.middleware import CSPMiddleware as BaseCSPMiddleware
from csp.middleware import PolicyParts
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponseBase


class CSPMiddleware(BaseCSPMiddleware):
    def get_policy_parts(self, request: HttpRequest, response: HttpResponseBase, report_only: bool = False) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        try:
            host = request.get_host()  # checked against ALLOWED_HOSTS
        except DisallowedHost:
            return parts
        websocket = ("wss://" if request.is_secure() else "ws://") + host
        update = dict(parts.update or {})
        update["connect-src"] = [*update.get("connect-src", ()), websocket]
        parts.update = update
        return parts
