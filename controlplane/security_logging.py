"""Secrets never reach a log: every log record is redacted where it is made.

What counts as a secret: Lockstep's tokens of every kind (``lsk_`` API, ``lsa_`` agent, ``lsj_`` job, ``lsl_``
launcher: tenancy.tokens; the prefix stays, it names the token), the value of an Authorization header, the value
of anything keyed like a password, secret, token, key, credential, kubeconfig, session or CSRF cookie, PEM private
keys and JWTs (Kubernetes service account tokens). See docs/security.md.

``configure`` is Django's LOGGING_CONFIG: it applies LOGGING and installs a log record factory that redacts
each record as it is created, so every handler in the process (Django's, uvicorn's access and error logs,
Celery's, a test's log capture) sees the redacted record. ``RedactSecretsFilter`` does the same for a handler
that receives records made elsewhere.
"""

import logging
import logging.config
import re

MASK = "***"

# A token's kind is ``ls`` and one letter (tenancy.models.Token.kind; a test holds every model to it), so no list
# of kinds here can fall behind the models that mint them. This module loads before the models can.
_KIND = r"ls[a-z]_"
_TOKEN_KIND = re.compile(_KIND)
_TOKEN = re.compile(rf"(?<![A-Za-z0-9])({_KIND}[a-z0-9]{{8}}_)[A-Za-z0-9_-]{{8,}}")
_PRIVATE_KEY = re.compile(
    r"-----BEGIN ([A-Z ]*)PRIVATE KEY-----.*?(?:-----END \1PRIVATE KEY-----|$)", re.DOTALL
)
_JWT = re.compile(r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*")
_SCHEME = r"(?:(?:bearer|basic|token|digest|negotiate)\s+)?"
# A key that names a secret, a separator (``: ``, ``=``, or the ``', b'`` of a header tuple), then its value,
# quoted (up to the closing quote) or bare (up to a delimiter).
_KEYED = re.compile(
    r"""(?P<key>(?:password|passwd|secret|token|api[_-]?key|access[_-]?key|private[_-]?key|client[_-]?key"""
    r"""|credentials?|kubeconfig|sessionid|session[_-]?key|csrftoken|cookie|authorization)[\w.-]*)"""
    r"""(?P<sep>["']?\s*[:=]\s*|["']\s*,\s*)"""
    r"""(?:(?P<bytes>b?)(?P<quote>["'])(?P<scheme_q>"""
    + _SCHEME
    + r""")(?P<quoted>(?:\\.|(?!(?P=quote)).)*)(?P=quote)"""
    r"""|(?P<scheme>""" + _SCHEME + r""")(?P<bare>[^\s&,;}\])"']+))""",
    re.IGNORECASE,
)


def _keyed(match: re.Match) -> str:
    head = match.group("key") + match.group("sep")
    if match.group("quote") is not None:
        quote = match.group("quote")
        return f"{head}{match.group('bytes')}{quote}{match.group('scheme_q')}{MASK}{quote}"
    return f"{head}{match.group('scheme')}{MASK}"


# Cheap substring tests that let most log lines skip the regular expressions.
_KEY_WORDS = tuple("pass secret token key credential kubeconfig session csrf cookie authoriz".split())


def redact(text: str) -> str:
    """The text with every secret replaced by ``***`` (a token keeps its ``lsk_<prefix>_``). Idempotent."""
    if not text:
        return text
    if "PRIVATE KEY-----" in text:
        text = _PRIVATE_KEY.sub(f"-----BEGIN \\1PRIVATE KEY-----{MASK}", text)
    if _TOKEN_KIND.search(text):
        text = _TOKEN.sub(rf"\1{MASK}", text)
    if "eyJ" in text:
        text = _JWT.sub(MASK, text)
    lowered = text.lower()
    if any(word in lowered for word in _KEY_WORDS):
        text = _KEYED.sub(_keyed, text)
    return text


class _Redacted:
    """Stands in for a log argument whose text held a secret, for both %s and %r."""

    def __init__(self, value):
        self.text, self.representation = redact(str(value)), redact(repr(value))

    def __str__(self):
        return self.text

    def __repr__(self):
        return self.representation


def _redact_argument(value):
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return redact(value)
    text = str(value)
    if redact(text) != text or redact(repr(value)) != repr(value):
        return _Redacted(value)
    return value


def redact_record(record: logging.LogRecord) -> logging.LogRecord:
    """Redact a record in place. Arguments are redacted one by one where that suffices, so formatters that read
    them (uvicorn's access log) keep working; otherwise the message is replaced by its redacted text."""
    if getattr(record, "_redacted_msg", None) is record.msg and record.msg is not None:
        return record  # already done (the factory, then a handler's filter)
    try:
        message = record.getMessage()
    except Exception:  # a malformed call: logging reports it when the record is emitted
        return record
    if redact(message) != message:
        args = record.args
        if isinstance(args, tuple):
            args = tuple(_redact_argument(value) for value in args)
        elif isinstance(args, dict):
            args = {key: _redact_argument(value) for key, value in args.items()}
        msg = redact(record.msg) if isinstance(record.msg, str) and not args else record.msg
        try:
            candidate = (msg % args) if args else str(msg)
        except (TypeError, ValueError, KeyError):
            candidate = None
        if candidate is not None and redact(candidate) == candidate:
            record.msg, record.args = msg, args
        else:
            record.msg, record.args = redact(message), ()
    if record.exc_info and not record.exc_text:
        text = logging.Formatter().formatException(record.exc_info)
        if redact(text) != text:
            record.exc_text = redact(text)
    if record.stack_info:
        record.stack_info = redact(record.stack_info)
    record._redacted_msg = record.msg
    return record


class RedactSecretsFilter(logging.Filter):
    """A logging filter that redacts secrets from every record it sees (and drops none)."""

    def filter(self, record: logging.LogRecord) -> bool:
        redact_record(record)
        return True


def _redacting_factory(base):
    def factory(*args, **kwargs):
        return redact_record(base(*args, **kwargs))

    factory.redacts_secrets = True
    return factory


def install_record_factory() -> None:
    """Make every log record in this process redact itself as it is created (once, however often called)."""
    current = logging.getLogRecordFactory()
    if not getattr(current, "redacts_secrets", False):
        logging.setLogRecordFactory(_redacting_factory(current))


def configure(logging_settings: dict) -> None:
    """Django's LOGGING_CONFIG: the LOGGING dict, and redaction of every record."""
    install_record_factory()
    if logging_settings:
        logging.config.dictConfig(logging_settings)
