from django import forms

from tenancy.choices import TokenScope


class ApiTokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What the token is for, e.g. ci-pipeline.")
    scope = forms.ChoiceField(choices=TokenScope.choices, initial=TokenScope.READ)
    expires_at = forms.DateTimeField(required=False, help_text="Optional, e.g. 2027-01-31 00:00 (UTC).",
                                     widget=forms.DateTimeInput(attrs={"type": "datetime-local"}))
