"""The agent token check (``Authorization: Bearer lsa_…``): tenancy's token check for the agent's kind."""

from telemetry.models import AgentToken
from tenancy.authentication import TokenAuthentication, TokenPrincipal


class AgentPrincipal(TokenPrincipal):
    """request.user for an agent: authenticated, no role; request.auth is the AgentToken."""

    name_template = "agent:{token.prefix}"


class AgentTokenAuthentication(TokenAuthentication):
    """``Authorization: Bearer lsa_…``: answers 401 naming what is wrong."""

    model = AgentToken
    realm = "ingest"
    related = ("cluster",)
    deferred = ("cluster__connection",)  # the driver's credentials: ingest reads only the cluster's key
    malformed = "Malformed agent token: agent tokens look like lsa_xxxxxxxx_…."
    unknown = "Unknown agent token."
    revoked = "Agent token has been revoked."
    principal = AgentPrincipal
