"""``{% job_checkpoint_advice job protection %}``: the job page's Young/Daly checkpoint advice.

A template tag, so the job page shows the simulator's advice without the jobs app importing the simulator
(DESIGN: no app imports ``simulator``)."""

from django import template

from simulator.checkpointing import job_checkpoint_advice as advise

register = template.Library()


@register.inclusion_tag("simulator/job_checkpoint_advice.html")
def job_checkpoint_advice(job, protection) -> dict:
    current = job.checkpoint_interval * job.seconds_per_iteration if job.checkpoint_interval else None
    advice = advise(
        gpus=job.gpus,
        protected=bool(getattr(protection, "protected", False)),
        restart_overhead_minutes=job.cluster.restart_overhead_minutes,
        current_interval_seconds=current,
    )
    return {"advice": advice}
