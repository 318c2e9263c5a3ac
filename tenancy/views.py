from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from controlplane.errors import ServiceError
from controlplane.security_ratelimit import LOGIN, TOKEN_CREATE, refused, retry_after
from tenancy import selectors, services
from tenancy.forms import ApiTokenForm


class LoginView(auth_views.LoginView):
    """The login form. Attempts past LOGIN_RATE (per user name and address) or LOGIN_ADDRESS_RATE are answered
    429 with Retry-After, before the password is checked."""

    def post(self, request, *args, **kwargs):
        wait = refused(request, LOGIN)
        if wait is None:
            return super().post(request, *args, **kwargs)
        form = self.get_form_class()(request, initial={"username": request.POST.get("username", "")})
        context = self.get_context_data(form=form, throttled=wait)
        return retry_after(self.render_to_response(context, status=429), wait)


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
    response = render(request, "tenancy/apitoken_list.html", {"form": form, "tokens": tokens, "created": created},
                      status=status)
    return retry_after(response, wait) if wait is not None else response


@login_required
@require_POST
def token_revoke(request, pk: int):
    token = get_object_or_404(selectors.token_list(user=request.user), pk=pk)
    services.token_revoke(actor=request.user, token=token)
    messages.success(request, f"Token {token.name} ({token.prefix}…) revoked.")
    return redirect("token-list")
