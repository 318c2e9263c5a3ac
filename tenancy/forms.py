from django import forms

from tenancy.choices import Role, TokenScope


class ApiTokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What the token is for, e.g. ci-pipeline.")
    scope = forms.ChoiceField(choices=TokenScope.choices, initial=TokenScope.READ)
    expires_at = forms.DateTimeField(
        required=False,
        help_text="Optional, e.g. 2027-01-31 00:00 (UTC).",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )


class UserForm(forms.Form):
    """A new user of a tenant: the provider admin chooses the tenant, a tenant admin adds to its own."""

    username = forms.RegexField(
        regex=r"^[\w.@+-]+\Z", max_length=150, help_text="Letters, digits and @ . + - _ only."
    )
    email = forms.EmailField(required=False)
    role = forms.ChoiceField(
        choices=[
            (Role.TENANT_ADMIN.value, Role.TENANT_ADMIN.label),
            (Role.TENANT_VIEWER.value, Role.TENANT_VIEWER.label),
        ],
        initial=Role.TENANT_VIEWER.value,
    )
    tenant = forms.TypedChoiceField(coerce=int, required=False, empty_value=None)

    def __init__(self, *args, tenants=None, **kwargs):
        super().__init__(*args, **kwargs)
        if tenants is None:
            del self.fields["tenant"]
        else:
            self.fields["tenant"].required = True
            self.fields["tenant"].choices = [("", "—")] + [(t.pk, t.name) for t in tenants]
