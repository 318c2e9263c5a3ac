from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from controlplane.access import PROVIDER_ROLES, TENANT_ROLES, Refused, principal, require
from controlplane.confirm import carry_out, confirm_page, confirmed
from controlplane.errors import ServiceError
from controlplane.security_ratelimit import LOGIN, TOKEN_CREATE, refused, retry_after
from tenancy import selectors, services
from tenancy.choices import Role
from tenancy.forms import ApiTokenForm, RoleForm, UserForm


class LoginView(auth_views.LoginView):
    """The login form. Attempts past LOGIN_RATE (per user name and address) or LOGIN_ADDRESS_RATE are answered
    429 with Retry-After, before the password is checked."""

    def post(self, request, *args, **kwargs):
        wait = refused(request, LOGIN)
        if wait is None:
            return super().post(request, *args, **kwargs)
        services.login_refused(username=request.POST.get("username", ""), throttled=True)
        form = self.get_form_class()(request, initial={"username": request.POST.get("username", "")})
        context = self.get_context_data(form=form, throttled=wait)
        return retry_after(self.render_to_response(context, status=429), wait)

    def get_context_data(self, **kwargs):
        """The local form, and the single sign-on button where it is configured (tenancy/sso.py)."""
        context = super().get_context_data(**kwargs)
        context["sso_name"] = settings.OIDC_PROVIDER_NAME if settings.SSO_ENABLED else None
        return context

    def form_invalid(self, form):
        services.login_refused(username=self.request.POST.get("username", ""))
        return super().form_invalid(form)


@login_required
def token_list(request):
    """Your API tokens (and, for admins, those you manage); create one, shown once; revoke."""
    form = ApiTokenForm(request.POST or None)
    created = None
    status = 200
    wait = refused(request, TOKEN_CREATE) if request.method == "POST" else None
    if wait is not None:
        form.add_error(None, f"Too many tokens created: try again in {wait} seconds.")
        status = 429
    elif request.method == "POST" and form.is_valid():
        try:
            token, raw = services.token_create(actor=request.user, owner=request.user, **form.cleaned_data)
        except ServiceError as error:
            form.add_error(error.field if error.field in form.fields else None, error.detail)
        else:
            created = {"token": token, "raw": raw}
            form = ApiTokenForm()
    tokens = selectors.token_list(user=request.user)
    response = render(
        request,
        "tenancy/apitoken_list.html",
        {"form": form, "tokens": tokens, "created": created},
        status=status,
    )
    return retry_after(response, wait) if wait is not None else response


@login_required
@require_POST
def token_revoke(request, pk: int):
    token = get_object_or_404(selectors.token_list(user=request.user), pk=pk)
    if not confirmed(request):
        return confirm_page(
            request,
            title=f"Revoke token {token.name}",
            question=f"Revoke {token.name} (lsk_{token.prefix}_…) of {token.user.get_username()}?",
            consequences=[
                "Every request and websocket using it is refused from now on; this "
                "cannot be undone (create a new token instead)."
            ],
            action_url=request.path,
            back_url=reverse("token-list"),
            button="Revoke",
        )
    services.token_revoke(actor=request.user, token=token)
    messages.success(request, f"Token {token.name} ({token.prefix}…) revoked.")
    return redirect("token-list")


def _user_admin(request):
    """The provider admin manages every tenant's users, a tenant admin its own tenant's (DESIGN); others 403."""
    who = principal(request.user)
    require(who.manages_users, "only the provider admin and tenant admins manage users")
    return who


def _grantable(who) -> list[str]:
    """The roles ``who`` may give: every role for the provider admin, the tenant roles for a tenant admin."""
    return [role for role in Role.values if who.is_provider_admin or role in TENANT_ROLES]


def _role_form(request, who, form_class, data=None):
    """The add or change-role form for ``who``. A role it may not give is refused (403) before anything else,
    so that the answer is the same as the API's; an unknown one is bad input (400)."""
    if data is not None and data.get("role") in Role.values:
        require(data["role"] in _grantable(who), "You may not give this role.")
    tenants = list(selectors.tenant_list(user=request.user)) if who.is_provider_admin else None
    return form_class(data, roles=_grantable(who), tenants=tenants)


def _chosen_tenant(request, who, data: dict):
    """The tenant a valid form names: the provider admin's choice, a tenant admin's own; None for provider roles."""
    tenant_id = data.pop("tenant", None) if who.is_provider_admin else who.tenant_id
    if data["role"] in PROVIDER_ROLES:
        return None
    tenant = selectors.tenant_list(user=request.user).filter(pk=tenant_id).first()
    if tenant is None:
        raise ServiceError("no such tenant", field="tenant")
    return tenant


def _user_page(request, who, form, *, status=200, **notices):
    return render(
        request,
        "tenancy/user_list.html",
        {
            "form": form,
            "users": selectors.user_list(user=request.user),
            "who": who,
            "roles": [(role, Role(role).label) for role in _grantable(who)],
            "tenants": list(selectors.tenant_list(user=request.user)) if who.is_provider_admin else None,
            **notices,
        },
        status=status,
    )


@login_required
@require_http_methods(["GET", "POST"])
def user_list(request):
    """A tenant's users (every tenant's for the provider admin): add one of any role the asker may give (its
    password shown once); change a role, reset a password, disable. The API's /api/v1/users/ does the same."""
    who = _user_admin(request)
    form = _role_form(request, who, UserForm, request.POST or None)
    if request.method == "GET":
        return _user_page(request, who, form)
    if not form.is_valid():
        return _user_page(request, who, form, status=400)
    data = dict(form.cleaned_data)
    try:
        tenant = _chosen_tenant(request, who, data)
        user, password = services.user_create(actor=request.user, tenant=tenant, **data)
    except Refused:
        raise
    except ServiceError as error:
        form.add_error(error.field if error.field in form.fields else None, error.detail)
        return _user_page(request, who, form, status=error.status)
    created = {"user": user, "password": password, "tenant": tenant}
    return _user_page(request, who, _role_form(request, who, UserForm), created=created)


def _managed_user(request, pk: int):
    """A user the asker manages (404 otherwise: another tenant's user is not there for it), not disabled."""
    who = _user_admin(request)
    return who, get_object_or_404(selectors.user_list(user=request.user), pk=pk)


def _ask(request, title: str, question: str, consequence: str, *, button: str):
    """The confirmation of a change to a user, posted back to this page; Cancel goes back to the users page."""
    return confirm_page(
        request,
        title=title,
        question=question,
        consequences=[consequence],
        action_url=request.path,
        back_url=reverse("user-list"),
        button=button,
    )


@login_required
@require_POST
def user_role(request, pk: int):
    """Change a user's role (and, for the provider admin, tenant): audited; 403 for a role the asker may not
    give, 400 for bad input, 409 for one's own role."""
    who, user = _managed_user(request, pk)
    form = _role_form(request, who, RoleForm, request.POST)
    if not form.is_valid():
        return _user_page(
            request, who, _role_form(request, who, UserForm), status=400, role_form=form, target=user
        )
    data = dict(form.cleaned_data)
    try:
        tenant = _chosen_tenant(request, who, data)
        changes = services.user_set_role(actor=request.user, user=user, role=data["role"], tenant=tenant)
    except Refused:
        raise
    except ServiceError as error:
        form.add_error(error.field if error.field in form.fields else None, error.detail)
        return _user_page(
            request, who, _role_form(request, who, UserForm), status=error.status, role_form=form, target=user
        )
    where = f" in {tenant.name}" if tenant else ""
    label = Role(data["role"]).label
    messages.success(
        request,
        f"{user.get_username()} is now {label}{where}."
        if changes
        else f"{user.get_username()} was already {label}.",
    )
    return redirect("user-list")


@login_required
@require_POST
def user_password_reset(request, pk: int):
    """Give a local user a new random password, shown this once on the answer (after a confirmation)."""
    who, user = _managed_user(request, pk)
    if not confirmed(request):
        return _ask(
            request,
            f"Reset the password of {user.get_username()}",
            f"Give {user.get_username()} a new password?",
            "Its current password stops working and its open sessions end; the new one is shown once, to hand "
            "over on a safe channel. Its API tokens keep working.",
            button="Reset password",
        )
    try:
        password = services.user_reset_password(actor=request.user, user=user)
    except Refused:
        raise
    except ServiceError as error:
        messages.error(request, error.detail)
        return redirect("user-list")
    reset = {"user": user, "password": password}
    return _user_page(request, who, _role_form(request, who, UserForm), reset=reset)


@login_required
@require_POST
def user_remove(request, pk: int):
    """Disable a user (its tokens revoked, its websockets closed; gone from every list), after a confirmation."""
    _, user = _managed_user(request, pk)
    if not confirmed(request):
        return _ask(
            request,
            f"Disable {user.get_username()}",
            f"Disable {user.get_username()}?",
            "The user can no longer log in, locally or through single sign-on; its API tokens are revoked, its "
            "open pages stop updating, and it leaves every list of users.",
            button="Disable",
        )
    return carry_out(
        request,
        lambda: services.user_deactivate(actor=request.user, user=user),
        done=f"{user.get_username()} disabled.",
        back="user-list",
    )
