from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from controlplane.access import principal, require
from controlplane.confirm import carry_out, confirm_page, confirmed
from controlplane.errors import ServiceError
from controlplane.security_ratelimit import LOGIN, TOKEN_CREATE, refused, retry_after
from tenancy import selectors, services
from tenancy.forms import ApiTokenForm, UserForm


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


@login_required
@require_http_methods(["GET", "POST"])
def user_list(request):
    """A tenant's users (every tenant's for the provider admin): add one (its password shown once), remove one.
    Through the services POST and DELETE /api/v1/users/ call."""
    who = _user_admin(request)
    tenants = (
        list(selectors.tenant_list(user=request.user).order_by("name")) if who.is_provider_admin else None
    )
    form = UserForm(request.POST or None, tenants=tenants)
    created, status = None, 200
    if request.method == "POST":
        if not form.is_valid():
            status = 400
        else:
            data = dict(form.cleaned_data)
            tenant_id = data.pop("tenant", None) if tenants is not None else who.tenant_id
            tenant = selectors.tenant_list(user=request.user).filter(pk=tenant_id).first()
            try:
                if tenant is None:
                    raise ServiceError("no such tenant", field="tenant")
                user, password = services.user_create(actor=request.user, tenant=tenant, **data)
            except ServiceError as error:
                form.add_error(error.field if error.field in form.fields else None, error.detail)
                status = error.status
            else:
                created = {"user": user, "password": password, "tenant": tenant}
                form = UserForm(tenants=tenants)
    users = selectors.user_list(user=request.user).filter(is_active=True)
    return render(
        request,
        "tenancy/user_list.html",
        {"form": form, "users": users, "created": created, "who": who},
        status=status,
    )


@login_required
@require_POST
def user_remove(request, pk: int):
    """Deactivate a user (its tokens revoked, its websockets closed), after a confirmation."""
    _user_admin(request)
    user = get_object_or_404(selectors.user_list(user=request.user).filter(is_active=True), pk=pk)
    if not confirmed(request):
        return confirm_page(
            request,
            title=f"Remove {user.get_username()}",
            question=f"Remove {user.get_username()}?",
            consequences=[
                "The user can no longer log in; its API tokens are revoked and its open pages stop updating."
            ],
            action_url=request.path,
            back_url=reverse("user-list"),
            button="Remove",
        )
    return carry_out(
        request,
        lambda: services.user_deactivate(actor=request.user, user=user),
        done=f"{user.get_username()} removed.",
        back="user-list",
    )
