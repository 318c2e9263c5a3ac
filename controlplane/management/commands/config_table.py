from django.conf import settings
from django.core.management.base import BaseCommand


def _default(cast, value) -> str:
    if cast is list:
        return ",".join(value) or "(empty)"
    if cast is str and value == "":
        return "(empty)"
    return str(value).lower() if cast is bool else str(value)


class Command(BaseCommand):
    help = "Print the README's configuration table from settings.ENVIRONMENT (the single list of settings)."

    def handle(self, *args, **options):
        self.stdout.write("| variable | default | meaning |")
        self.stdout.write("| --- | --- | --- |")
        for name, (cast, default, meaning) in settings.ENVIRONMENT.items():
            self.stdout.write(f"| `{name}` | `{_default(cast, default)}` | {meaning} |")
