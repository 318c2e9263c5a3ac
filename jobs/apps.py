from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = "Jobs"

    def ready(self):
        from controlplane import events, navigation
        from fleet import hooks
        from jobs import schema  # noqa: F401  (registers the job token scheme with drf-spectacular)
        from jobs.selectors import hardware_fault_count, may_see_job_topic
        from jobs.services.escalation import drain_guard

        # DESIGN: provider roles see every job; a tenant's users see their own tenant's jobs.
        events.register_topic("job", keyed=True, may_subscribe=may_see_job_topic)
        hooks.register_fault_counter(hardware_fault_count)
        hooks.register_drain_guard(drain_guard)
        from jobs.services.drain import drain_started

        hooks.register_drain_started(drain_started)
        from jobs import launchers

        hooks.register_node_reason(launchers.node_reason)
        hooks.register_slurm_job_of(launchers.slurm_job_of)
        navigation.register("Jobs", "job-list", audience="all", order=20)
        navigation.register("Faults", "fault-overview", audience="all", order=25)
        navigation.register("Incidents", "incident-list", audience="all", order=26)
