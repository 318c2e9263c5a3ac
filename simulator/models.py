"""The simulator's own state: the world it built and the credentials its fake agents and operators use."""

from django.db import models


class SimWorld(models.Model):
    """One demo world. Its tokens are the simulated agents' and operator's credentials (in a real fleet they
    would sit in each agent's config file); they are the simulator's, never shown by Lockstep's pages or API."""

    seed = models.IntegerField()
    built_at = models.DateTimeField(auto_now_add=True)
    agent_tokens = models.JSONField(default=dict)
    api_token = models.CharField(max_length=120)

    def __str__(self):
        return f"world seed {self.seed}"
