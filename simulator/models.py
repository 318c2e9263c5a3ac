"""The simulator's own state: the world it built and the credentials its fake agents and operators use."""

from django.db import models

from simulator.choices import ScenarioState, WhatIfState


class SimWorld(models.Model):
    """One demo world. Its tokens are the simulated agents' and operator's credentials (in a real fleet they
    would sit in each agent's config file); they are the simulator's, never shown by Lockstep's pages or API."""

    seed = models.IntegerField()
    built_at = models.DateTimeField(auto_now_add=True)
    agent_tokens = models.JSONField(default=dict)
    api_token = models.CharField(max_length=120)

    def __str__(self):
        return f"world seed {self.seed}"


class WhatIfRun(models.Model):
    """A what-if replay started from the page or the API; its report when done."""

    State = WhatIfState  # the model's name for its choices (simulator.choices)

    created_by = models.ForeignKey(
        "auth.User", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    config = models.JSONField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    progress = models.FloatField(default=0.0)
    report = models.JSONField(null=True, blank=True)
    error = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"what-if {self.pk} ({self.state})"


class Scenario(models.Model):
    """A scripted scenario (``ab-nic``): its jobs and the deadline at which its fault strikes, checked by beat."""

    State = ScenarioState

    kind = models.CharField(max_length=20)
    jobs = models.JSONField(default=dict, help_text='{"protected": job id, "unprotected": job id}')
    nic_name = models.CharField(max_length=30, blank=True)
    strike_at = models.DateTimeField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.ARMED)
    created_at = models.DateTimeField(auto_now_add=True)
    fired_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"{self.kind} {self.pk} ({self.state})"
