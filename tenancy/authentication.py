from rest_framework import authentication, exceptions

from controlplane import context
from tenancy.tokens import TokenError, user_for_bearer


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <token>``; answers 401 naming what is wrong with a token."""

    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request)
        if not header:
            return None
        try:
            text = header.decode("ascii")
        except UnicodeDecodeError as error:
            raise exceptions.AuthenticationFailed("Malformed Authorization header: not ASCII.") from error
        parts = text.split()
        if not parts or parts[0].lower() != "bearer":
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Malformed Authorization header: expected 'Bearer <token>'.")
        try:
            user, token = user_for_bearer(parts[1], method=request.method)
        except TokenError as error:
            raise exceptions.AuthenticationFailed(error.message, code=error.reason) from error
        context.note_token(token.prefix)
        return user, token

    def authenticate_header(self, request):
        return 'Bearer realm="api"'
