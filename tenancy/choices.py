from django.db import models

from controlplane.access import Role  # noqa: F401  (the roles of DESIGN's permission table)


class TenantTier(models.TextChoices):
    STANDARD = "standard", "Standard"
    RESILIENT = "resilient", "Resilient"


class TokenScope(models.TextChoices):
    READ = "read", "Read"
    WRITE = "write", "Write"
