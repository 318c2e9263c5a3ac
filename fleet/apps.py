from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"
    verbose_name = "Fleet"

    def ready(self):
        from controlplane import events, navigation
        from fleet.selectors import may_see_cluster_topic

        # Fleet-wide figures and events are for provider roles (DESIGN's permission table).
        events.register_topic("fleet", keyed=False, may_subscribe=lambda who, key: who.sees_fleet)
        events.register_topic("cluster", keyed=True, may_subscribe=may_see_cluster_topic)
        # Rollouts are for provider roles (DESIGN's permission table).
        events.register_topic("rollout", keyed=True, may_subscribe=lambda who, key: who.is_provider)
        navigation.register("Fleet", "fleet-overview", audience="all", order=20)
        navigation.register("Clusters", "fleet-clusters", audience="all", order=21)
        navigation.register("Blueprints", "fleet-blueprints", audience="provider", order=22)
        navigation.register("Rollouts", "fleet-rollouts", audience="provider", order=24)
        navigation.register("Drift", "fleet-drift", audience="all", order=26)
