"""Job tokens: ``Authorization: Bearer lsj_<prefix>_<secret>``, bound to one job, for its progress reports."""

from jobs.models import JobToken
from tenancy.authentication import TokenAuthentication, TokenPrincipal


class JobTokenUser(TokenPrincipal):
    """Who a job token stands for: the job itself. It has no role, so it may do nothing but report progress."""

    name_template = "job-{token.job_id}"


class JobTokenAuthentication(TokenAuthentication):
    """Answers only for ``lsj_`` tokens; every other header is left to the next authenticator."""

    model = JobToken
    own_kind_only = True
    noted = True
    related = ("job",)
    malformed = None
    unknown = revoked = "Unknown or revoked job token."
    principal = JobTokenUser
