from django.core.management.base import BaseCommand, CommandError

from controlplane import context
from fleet.models import Cluster
from telemetry.services.tokens import agent_token_create


class Command(BaseCommand):
    help = "Create an agent token bound to CLUSTER and print it (shown once)."

    def add_arguments(self, parser):
        parser.add_argument("cluster")
        parser.add_argument("--name", default="agents")

    def handle(self, *args, cluster, name, **options):
        found = Cluster.objects.filter(name=cluster).first()
        if found is None:
            raise CommandError(f"no cluster {cluster!r}")
        token_ctx = context.set_context(context.RequestContext(source="cli"))
        try:
            _, raw = agent_token_create(actor=None, cluster=found, name=name)
        finally:
            context.reset(token_ctx)
        self.stdout.write(raw)
