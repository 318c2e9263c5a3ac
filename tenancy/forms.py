from django import forms

from controlplane.access import PROVIDER_ROLES
from tenancy.choices import Role, TokenScope


class ApiTokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What the token is for, e.g. ci-pipeline.")
    scope = forms.ChoiceField(choices=TokenScope.choices, initial=TokenScope.READ)
    expires_at = forms.DateTimeField(
        required=False,
        help_text="Optional, e.g. 2027-01-31 00:00 (UTC).",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )


class RoleForm(forms.Form):
    """A user's role and, for tenant roles, tenant. ``roles`` are those the asker may give; ``tenants`` the
    tenants it may choose from (None: a tenant admin, whose own tenant it is)."""

    role = forms.ChoiceField()
    tenant = forms.TypedChoiceField(coerce=int, required=False, empty_value=None)

    def __init__(self, *args, roles, tenants=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["role"].choices = [(role, Role(role).label) for role in roles]
        self.fields["role"].initial = Role.TENANT_VIEWER.value
        if tenants is None:
            del self.fields["tenant"]
        else:
            self.fields["tenant"].choices = [("", "— (provider roles)")] + [(t.pk, t.name) for t in tenants]
            self.fields["tenant"].help_text = "For tenant roles; provider roles belong to no tenant."

    def clean(self):
        data = super().clean()
        if "tenant" in self.fields and data.get("role") in Role.values:
            if data["role"] in PROVIDER_ROLES:
                data["tenant"] = None
            elif data.get("tenant") is None:
                self.add_error("tenant", "Choose the tenant for a tenant role.")
        return data


class UserForm(RoleForm):
    """A new user: its name, email and role (and the provider admin chooses the tenant)."""

    username = forms.RegexField(
        regex=r"^[\w.@+-]+\Z", max_length=150, help_text="Letters, digits and @ . + - _ only."
    )
    email = forms.EmailField(required=False)

    field_order = ["username", "email", "role", "tenant"]
