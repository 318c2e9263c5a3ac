from django.conf import settings
from django.core.management.base import BaseCommand

from controlplane import context
from tenancy import services


class Command(BaseCommand):
    help = "Create the demo provider admin if it does not exist, printing its password once."

    def handle(self, *args, **options):
        username = settings.DEMO_ADMIN_USERNAME
        token_ctx = context.set_context(context.RequestContext(source="cli"))
        try:
            password = services.demo_admin_ensure(username=username)
        finally:
            context.reset(token_ctx)
        if password:
            self.stdout.write(
                self.style.SUCCESS(
                    f"Demo admin created: user {username!r}, password {password!r} (shown once)."
                )
            )
        else:
            self.stdout.write(f"Demo admin {username!r} exists; its password was shown when it was created.")
