"""What a locked-out login sees: the login page again, saying why and for how long (django-axes
calls this, as `AXES_LOCKOUT_CALLABLE`, when a login is refused for too many failures)."""

from __future__ import annotations

import math
from typing import Any

from axes.helpers import get_cool_off
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def login_locked_out(request: HttpRequest, original_response: HttpResponse | None = None,
                     credentials: dict[str, Any] | None = None) -> HttpResponse:
    """429 with the login form: "too many failed logins, try again in N minutes". Each try while
    locked out starts the cool-off again (axes' default), so N is counted from now."""
    cool_off = get_cool_off(request)
    minutes = math.ceil(cool_off.total_seconds() / 60) if cool_off else None
    username = request.POST.get("username", "")[:150]
    form = AuthenticationForm(request, initial={"username": username})
    return render(request, "login.html", {"form": form, "locked_out_minutes": minutes, "next": request.POST.get("next", "")},
                  status=429)
