"""Forms of a run's labels: its tags and notes."""

from __future__ import annotations

from django import forms


class RunTagsForm(forms.Form):
    tags = forms.CharField(required=False, max_length=1000, help_text="Comma-separated, e.g. baseline, lr-sweep.")


class RunNotesForm(forms.Form):
    notes = forms.CharField(required=False, max_length=20_000, widget=forms.Textarea(attrs={"rows": 5}))
