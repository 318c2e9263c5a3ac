"""Job tokens: ``Authorization: Bearer lsj_<prefix>_<secret>``, bound to one job, for its progress reports."""

from django.utils import timezone
from rest_framework import authentication, exceptions

from controlplane import context
from controlplane.access import ANONYMOUS
from jobs.models import JobToken
from jobs.services.jobs import TOKEN_PREFIX, token_digest


class JobTokenUser:
    """Who a job token stands for: the job itself. It has no role, so it may do nothing but report progress."""

    is_authenticated = True
    is_active = True
    is_anonymous = False
    is_superuser = False
    pk = None
    id = None
    _lockstep_principal = ANONYMOUS

    def __init__(self, token: JobToken):
        self.token = token
        self.job_id = token.job_id

    def get_username(self) -> str:
        return f"job-{self.job_id}"

    def __str__(self):
        return self.get_username()


class JobTokenAuthentication(authentication.BaseAuthentication):
    """Answers only for ``lsj_`` tokens; every other header is left to the next authenticator."""

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if len(header) != 2 or header[0].lower() != b"bearer" or not header[1].startswith(f"{TOKEN_PREFIX}_".encode()):
            return None
        raw = header[1].decode("ascii", errors="replace")
        token = JobToken.objects.select_related("job").filter(digest=token_digest(raw)).first()
        if token is None or token.revoked_at is not None:
            raise exceptions.AuthenticationFailed("Unknown or revoked job token.")
        now = timezone.now()
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            JobToken.objects.filter(pk=token.pk).update(last_used_at=now)
        context.note_token(token.prefix)
        return JobTokenUser(token), token

    def authenticate_header(self, request):
        return 'Bearer realm="api"'
