"""The bearer check every kind of token goes through (``TokenAuthentication``), and the API token's.

Each kind names its model, what ``request.user`` becomes, and what it answers when a token is wrong; the header's
reading, the lookup by digest, the revocation check and the last-used write are the same for all of them.
"""

import functools

from django.utils import timezone
from rest_framework import authentication, exceptions

from controlplane import context
from controlplane.access import ANONYMOUS
from controlplane.prepared import PreparedQuery
from tenancy.models import ApiToken, Token
from tenancy.services import token_touch
from tenancy.tokens import TokenError, api_token_by_digest, digest, shape

MALFORMED_HEADER = "Malformed Authorization header: expected 'Bearer <token>'."


class TokenPrincipal:
    """``request.user`` for a token that stands for no user (an agent's, a launcher's, a job's): authenticated,
    with no role, so it may do only what its own endpoints let its kind of token do."""

    is_authenticated = True
    is_active = True
    is_anonymous = False
    is_superuser = False
    pk = None
    id = None
    _lockstep_principal = ANONYMOUS

    name_template: str  # its name in logs, from its token: "agent:{token.prefix}"

    def __init__(self, token: Token):
        self.token = token

    def get_username(self) -> str:
        return self.name_template.format(token=self.token)

    def __str__(self):
        return self.get_username()


class TokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <kind>_…``: ``request.auth`` is the token, ``request.user`` what ``user_of`` makes
    of it; a token that is wrong is answered 401 saying what is wrong with it."""

    model: type[Token]
    realm = "api"
    # Whether it answers only for tokens of its own kind, leaving every other bearer header to the next
    # authenticator; if not, every bearer header is its to accept or refuse.
    own_kind_only = False
    # Whether the token's prefix goes into the request context, which names it in audit entries.
    noted = False
    related: tuple[str, ...] = ()
    # Columns of the token's related rows that its endpoints never read, left unloaded (a secret stays encrypted).
    deferred: tuple[str, ...] = ()
    # What request.user is for a token of a kind that stands for no user (else ``user_of`` says).
    principal: type[TokenPrincipal] | None = None
    # What a token is answered with when it is not of the kind's shape (None: not checked, so "unknown"),
    # unknown, or revoked.
    malformed: str | None
    unknown: str
    revoked: str

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != b"bearer":
            return None
        if self.own_kind_only and (
            len(header) != 2 or not header[1].startswith(f"{self.model.kind}_".encode())
        ):
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed(MALFORMED_HEADER)
        try:
            token = self.check(header[1].decode("latin-1"))
        except TokenError as error:
            raise exceptions.AuthenticationFailed(error.message, code=error.reason) from error
        if self.noted:
            context.note_token(token.prefix)
        return self.user_of(token), token

    def authenticate_header(self, request):
        return f'Bearer realm="{self.realm}"'

    def check(self, raw: str) -> Token:
        """The live token ``raw`` is, its use noted; or TokenError saying why not."""
        if not raw:
            raise TokenError("malformed", MALFORMED_HEADER)
        if self.malformed is not None and not shape(self.model.kind).match(raw):
            raise TokenError("malformed", self.malformed)
        token = self.find(digest(raw))
        if token is None:
            raise TokenError("unknown", self.unknown)
        if token.revoked_at is not None:
            raise TokenError("revoked", self.revoked)
        self.refuse(token)
        token_touch(token=token)
        return token

    def find(self, token_digest: str) -> Token | None:
        return _by_digest(self.model, self.related, self.deferred).first(digest=token_digest)

    def refuse(self, token: Token) -> None:
        """Raise TokenError if this live token may not authenticate for a reason of its kind's."""

    def user_of(self, token: Token):
        return self.principal(token)


@functools.cache
def _by_digest(model: type[Token], related: tuple[str, ...], deferred: tuple[str, ...]) -> PreparedQuery:
    """The lookup of a kind's token by its digest (unique), with its ``related`` rows: compiled once per process
    (controlplane/prepared.py), since every agent batch, launcher call and job report authenticates through it.
    Built by the ORM on each call it cost 2.3 ms of CPU, a quarter of a healthy agent batch; compiled, 0.25 ms
    (docs/benchmarks.md, "The agent batch's fixed costs")."""
    return PreparedQuery(
        lambda digest: model.objects.select_related(*related).defer(*deferred).filter(digest=digest),
        digest=str,
    )


class BearerTokenAuthentication(TokenAuthentication):
    """``Authorization: Bearer lsk_…``, a user's API token: ``request.user`` is its user."""

    model = ApiToken
    noted = True
    malformed = "Malformed bearer token: Lockstep tokens look like lsk_xxxxxxxx_…."
    unknown = "Unknown token."
    revoked = "Token has been revoked."

    def authenticate(self, request):
        try:
            authentication.get_authorization_header(request).decode("ascii")
        except UnicodeDecodeError as error:
            raise exceptions.AuthenticationFailed("Malformed Authorization header: not ASCII.") from error
        return super().authenticate(request)

    def find(self, token_digest: str) -> ApiToken | None:
        return api_token_by_digest(token_digest)

    def refuse(self, token: ApiToken) -> None:
        if token.expires_at is not None and token.expires_at <= timezone.now():
            raise TokenError("expired", "Token has expired.")
        if not token.user.is_active:
            raise TokenError("inactive", "The token's user is inactive.")

    def user_of(self, token: ApiToken):
        return token.user


def user_for_bearer(raw: str, *, method: str = "GET"):
    """The (user, token) an API token stands for, or TokenError saying why not; for the websocket and the health
    check, which read the token themselves. Scope is checked by the caller."""
    token = BearerTokenAuthentication().check(raw)
    return token.user, token
