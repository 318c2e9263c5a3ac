"""The confirmation step of destructive page actions: the first POST answers a page that says what will happen,
with a form that posts the same fields again plus ``confirmed=yes``; its Cancel is a plain link back, so nothing
changes unless the second form is sent. Works without JavaScript (no window.confirm)."""

from django.contrib import messages
from django.shortcuts import redirect, render

from controlplane.errors import ServiceError

CONFIRM_FIELD = "confirmed"


def confirmed(request) -> bool:
    """Whether this POST is the second, confirming one."""
    return request.POST.get(CONFIRM_FIELD) == "yes"


def confirm_page(
    request,
    *,
    title: str,
    question: str,
    action_url: str,
    back_url: str,
    button: str,
    consequences: list[str] | None = None,
    fields: dict | None = None,
    danger: bool = True,
):
    """The page that asks. ``fields`` are posted again with the confirmation (a reason typed on the first form)."""
    return render(
        request,
        "_confirm.html",
        {
            "title": title,
            "question": question,
            "action_url": action_url,
            "back_url": back_url,
            "button": button,
            "consequences": consequences or [],
            "fields": fields or {},
            "danger": danger,
        },
    )


def carry_out(request, call, *, done, back):
    """Do a page action through its service (``call()``), say what came of it — the service's refusal, or ``done``
    (a message, or a function of the service's result) — and go ``back`` (a URL or a URL name)."""
    try:
        result = call()
    except ServiceError as error:
        messages.error(request, error.detail)
    else:
        messages.success(request, done(result) if callable(done) else done)
    return redirect(back)
