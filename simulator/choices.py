from django.db import models


class WhatIfState(models.TextChoices):
    QUEUED = "queued", "Queued"
    RUNNING = "running", "Running"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"


class ScenarioState(models.TextChoices):
    ARMED = "armed", "Armed"
    FIRED = "fired", "Fired"
