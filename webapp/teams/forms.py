"""Forms of a member's account and the team's pages: a new account, a new API token, an invitation, the audit filters."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth import forms as auth_forms
from django.contrib.auth.forms import AdminUserCreationForm, UserChangeForm, UserCreationForm

from webapp.models import AuditEvent, Membership
from webapp.teams.audit import SYSTEM_ACTOR
from webapp.teams.usernames import username_check


class StrengthUnderPassword:
    """Django puts what its password validators say ("too short", "too common") under the
    confirmation field; here it goes under the password itself, where it was typed. A mismatch
    stays under the confirmation."""

    fields: Any

    def validate_password_for_user(self, user: Any, password_field_name: str = "password2") -> None:
        first = password_field_name[:-1] + "1"
        super().validate_password_for_user(user, first if first in self.fields else password_field_name)  # type: ignore[misc]


class PasswordChangeForm(StrengthUnderPassword, auth_forms.PasswordChangeForm):
    pass


class SetPasswordForm(StrengthUnderPassword, auth_forms.SetPasswordForm):
    pass


class SignupForm(StrengthUnderPassword, UserCreationForm):
    """A new account through an invitation: Django's checks, and a username in one writing system
    that looks like no existing one (`webapp.teams.usernames`)."""

    def clean_username(self) -> str | None:
        username = super().clean_username()  # None when Django found it taken (the error is added)
        if username is not None:
            username_check(username)
        return username


class AdminSignupForm(AdminUserCreationForm):
    """The admin's "add user" form, with the same username rules as `SignupForm`."""

    def clean_username(self) -> str | None:
        username = super().clean_username()
        if username is not None:
            username_check(username)
        return username


class AccountChangeForm(UserChangeForm):
    """The admin's user form: a renamed account meets the same username rules as a new one."""

    def clean_username(self) -> str:
        username = self.cleaned_data["username"]
        if username != self.initial.get("username"):
            username_check(username, exclude_pk=self.instance.pk)
        return username


class ApiTokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="Where the token is used, e.g. \"laptop notebook\".")


class InvitationForm(forms.Form):
    email = forms.EmailField(required=False, help_text="Optional: the link is also emailed there.")
    role = forms.ChoiceField(choices=Membership.Role.choices, initial=Membership.Role.MEMBER)


class AuditFilterForm(forms.Form):
    """The Audit page's filters (GET); each list offers only what the team's trail holds."""

    verb = forms.ChoiceField(required=False, label="Action", choices=[("", "Any action"), *AuditEvent.Verb.choices])
    actor = forms.ChoiceField(required=False, label="By")
    object_type = forms.ChoiceField(required=False, label="On")

    def __init__(self, data: Any, *, actors: list[str], object_types: list[str]):
        super().__init__(data)
        self.fields["actor"].choices = [("", "Anyone"), *[(a or SYSTEM_ACTOR, a or "Troupe itself") for a in actors]]
        self.fields["object_type"].choices = [("", "Anything"), *[(t, t) for t in object_types]]
