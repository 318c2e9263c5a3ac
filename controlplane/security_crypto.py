"""Secrets at rest: a model field whose JSON value is stored Fernet-encrypted (cluster credentials).

The keys come from ``CREDENTIALS_KEYS`` (newest first: the first encrypts, every one decrypts), or, when that is
empty, are derived from ``SECRET_KEY`` and ``SECRET_KEY_FALLBACKS``. Rotation: put the new key first, run
``manage.py rotate_credentials``, then drop the old one. See docs/security.md.
"""

import base64
import json
from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, ValidationError
from django.core.signals import setting_changed
from django.db import models
from django.dispatch import receiver
from django.utils.crypto import salted_hmac

_DERIVATION_SALT = "lockstep.security_crypto.credentials"


def derived_key(secret: str) -> bytes:
    """The Fernet key that SECRET_KEY ``secret`` stands for (HMAC-SHA256 with a purpose-specific salt)."""
    digest = salted_hmac(_DERIVATION_SALT, "fernet-key", secret=secret, algorithm="sha256").digest()
    return base64.urlsafe_b64encode(digest)


@lru_cache(maxsize=1)
def credentials_fernet() -> MultiFernet:
    """The MultiFernet of the configured keys."""
    configured = [key for key in settings.CREDENTIALS_KEYS if key]
    if configured:
        try:
            return MultiFernet([Fernet(key) for key in configured])
        except ValueError as error:
            raise ImproperlyConfigured(
                "CREDENTIALS_KEYS must be Fernet keys (32 url-safe base64-encoded bytes), comma-separated"
            ) from error
    secrets = [settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS]
    return MultiFernet([Fernet(derived_key(secret)) for secret in secrets if secret])


@receiver(setting_changed)
def _forget_keys(*, setting, **kwargs):
    if setting in ("CREDENTIALS_KEYS", "SECRET_KEY", "SECRET_KEY_FALLBACKS"):
        credentials_fernet.cache_clear()


class CredentialsUnreadable(ImproperlyConfigured):
    """Stored credentials that none of the configured keys decrypts (a key was dropped too early)."""


def encrypt_json(value) -> str:
    return credentials_fernet().encrypt(json.dumps(value, sort_keys=True).encode()).decode("ascii")


def decrypt_json(token: str):
    try:
        return json.loads(credentials_fernet().decrypt(token.encode("ascii")))
    except (InvalidToken, UnicodeEncodeError) as error:
        raise CredentialsUnreadable(
            "stored credentials cannot be decrypted with CREDENTIALS_KEYS (or the keys derived from SECRET_KEY and "
            "SECRET_KEY_FALLBACKS): put the key they were written with back in the list"
        ) from error


# Every Fernet token starts with the version byte 0x80 and a 64-bit timestamp whose top bytes are zero until 2106.
FERNET_MARK = "gAAAAA"


def read_stored(value):
    """The plain value of what the column holds. That is ciphertext, except while a deployment moves to encrypted
    credentials: a row the migration has not reached yet (or that the previous release, still serving, wrote
    during it) holds plain JSON, or JSON quoting the ciphertext it read. Those read as well; the migration and
    ``rotate_credentials`` encrypt them."""
    if isinstance(value, (dict, list)):  # a jsonb column, before the migration turns it to text
        return value
    if value.startswith(FERNET_MARK):
        return decrypt_json(value)
    plain = json.loads(value)
    if isinstance(plain, str) and plain.startswith(FERNET_MARK):
        return decrypt_json(plain)
    return plain


class EncryptedJSONField(models.TextField):
    """A JSON value (a dict of settings and credentials) stored as Fernet ciphertext in a text column. Python code
    reads and writes plain values; the database, its backups and dumpdata see only ciphertext. It cannot be
    filtered on."""

    description = "JSON, encrypted at rest"

    def from_db_value(self, value, expression, connection):
        if value is None:
            return None
        return read_stored(value)

    def to_python(self, value):
        if value is None or isinstance(value, (dict, list)):
            return value
        if isinstance(value, str):
            try:
                return read_stored(value)
            except json.JSONDecodeError as error:
                raise ValidationError("enter valid JSON", code="invalid") from error
        return value

    def get_prep_value(self, value):
        if value is None:
            return None
        return encrypt_json(value)

    def value_to_string(self, obj):
        """Serialized (dumpdata) as ciphertext; to_python reads it back."""
        value = self.value_from_object(obj)
        return None if value is None else encrypt_json(value)
