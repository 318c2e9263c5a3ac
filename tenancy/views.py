from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from controlplane.errors import ServiceError
from tenancy import selectors, services
from tenancy.forms import ApiTokenForm


@login_required
def token_list(request):
    """Your API tokens (and, for admins, those you manage); create one, shown once; revoke."""
    form = ApiTokenForm(request.POST or None)
    created = None
    if request.method == "POST" and form.is_valid():
        try:
            token, raw = services.token_create(actor=request.user, owner=request.user, **form.cleaned_data)
        except ServiceError as error:
            form.add_error(error.field if error.field in form.fields else None, error.detail)
        else:
            created = {"token": token, "raw": raw}
            form = ApiTokenForm()
    tokens = selectors.token_list(user=request.user)
    return render(request, "tenancy/apitoken_list.html", {"form": form, "tokens": tokens, "created": created})


@login_required
@require_POST
def token_revoke(request, pk: int):
    token = get_object_or_404(selectors.token_list(user=request.user), pk=pk)
    services.token_revoke(actor=request.user, token=token)
    messages.success(request, f"Token {token.name} ({token.prefix}…) revoked.")
    return redirect("token-list")
