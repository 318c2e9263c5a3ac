from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"
    verbose_name = "Fleet"

    def ready(self):
        from controlplane import events

        # Fleet-wide figures and events are for provider roles (DESIGN's permission table).
        events.register_topic("fleet", keyed=False, may_subscribe=lambda who, key: who.sees_fleet)
