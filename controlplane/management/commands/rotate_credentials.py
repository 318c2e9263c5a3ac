from django.apps import apps
from django.core.management.base import BaseCommand
from django.db import transaction

from controlplane.security_crypto import EncryptedJSONField


class Command(BaseCommand):
    help = (
        "Re-encrypt every secret stored at rest (cluster credentials) with the first of CREDENTIALS_KEYS, so the "
        "older keys can be dropped. Safe to run twice."
    )

    def handle(self, *args, **options):
        for model in apps.get_models():
            fields = [field for field in model._meta.concrete_fields if isinstance(field, EncryptedJSONField)]
            for field in fields:
                rotated = 0
                with transaction.atomic():
                    rows = model._base_manager.select_for_update().values_list("pk", field.attname)
                    for pk, value in rows:
                        # update() writes through the field, which encrypts with the first key.
                        model._base_manager.filter(pk=pk).update(**{field.attname: value})
                        rotated += 1
                self.stdout.write(f"{model._meta.label}.{field.name}: {rotated} re-encrypted")
