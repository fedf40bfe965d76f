"""Forms of a member's account: a new API token."""

from __future__ import annotations

from django import forms

from webapp.models import Membership


class ApiTokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Where the token is used, e.g. \"laptop notebook\".")


class InvitationForm(forms.Form):
    email = forms.EmailField(required=False, help_text="Optional: the link is also emailed there.")
    role = forms.ChoiceField(choices=Membership.Role.choices, initial=Membership.Role.MEMBER)
