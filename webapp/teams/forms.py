"""Forms of a member's account: a new API token."""

from __future__ import annotations

from django import forms


class ApiTokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Where the token is used, e.g. \"laptop notebook\".")
