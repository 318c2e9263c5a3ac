from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from controlplane import context
from tenancy import services
from tenancy.choices import TokenScope


class Command(BaseCommand):
    help = "Create an API token for USERNAME and print it (shown once) for automation bootstrap."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--scope", choices=TokenScope.values, default=TokenScope.READ)
        parser.add_argument("--name", default="cli")
        parser.add_argument("--expires-days", type=int, default=None)

    def handle(self, *args, username, scope, name, expires_days, **options):
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise CommandError(f"no active user {username!r}")
        expires_at = timezone.now() + timedelta(days=expires_days) if expires_days else None
        token_ctx = context.set_context(context.RequestContext(source="cli"))
        try:
            _, raw = services.token_create(
                actor=user, owner=user, name=name, scope=scope, expires_at=expires_at
            )
        finally:
            context.reset(token_ctx)
        self.stdout.write(raw)
