"""``manage.py blueprint apply -f FILE`` and ``manage.py blueprint export NAME``: blueprints as YAML, for git."""

import sys

from django.core.management.base import BaseCommand, CommandError

from controlplane.errors import ServiceError
from fleet import blueprint_yaml
from fleet.models import Blueprint
from fleet.services.blueprint_documents import blueprint_apply


class Command(BaseCommand):
    help = "Apply a blueprint YAML document, or export a blueprint as one."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        apply = sub.add_parser("apply", help="create or update a blueprint from a document (all or nothing)")
        apply.add_argument("-f", "--file", required=True, help="the YAML document; - reads standard input")
        export = sub.add_parser("export", help="print a blueprint as a document")
        export.add_argument("name")

    def handle(self, *args, action, **options):
        if action == "export":
            blueprint = Blueprint.objects.filter(name=options["name"]).first()
            if blueprint is None:
                raise CommandError(f"no blueprint named {options['name']}")
            self.stdout.write(blueprint_yaml.dump(blueprint), ending="")
            return
        path = options["file"]
        try:
            raw = sys.stdin.buffer.read() if path == "-" else open(path, "rb").read()  # noqa: SIM115
        except OSError as error:
            raise CommandError(f"cannot read {path}: {error}") from error
        try:
            document = blueprint_yaml.load(raw)
            blueprint, done = blueprint_apply(actor=None, document=document)
        except ServiceError as error:
            raise CommandError(f"{error.field}: {error.detail}" if error.field else error.detail) from error
        for line in done or ["nothing to change"]:
            self.stdout.write(f"{blueprint.name}: {line}")
