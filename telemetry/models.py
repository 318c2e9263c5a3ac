"""Telemetry: agent tokens, the latest state and prediction features per GPU and NIC, raw samples kept for a
short retention, a per-node per-minute history for charts, and facility series per rack or row."""

from django.conf import settings
from django.db import models

from telemetry.choices import DeliveryState, NotificationChannelKind, PredictionOutcome
from tenancy.models import Token


class AgentToken(Token):
    """A node agent's bearer token, bound to one cluster: it may report only for that cluster's nodes and racks."""

    kind = "lsa"

    cluster = models.ForeignKey("fleet.Cluster", on_delete=models.CASCADE, related_name="agent_tokens")
    name = models.CharField(max_length=100)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self):
        return f"{self.name} ({self.prefix}…) for {self.cluster_id}"


class IngestBatch(models.Model):
    """A batch already taken in: its id makes a replayed or retried batch change nothing."""

    batch_id = models.UUIDField()
    cluster = models.ForeignKey("fleet.Cluster", on_delete=models.CASCADE, related_name="+")
    received_at = models.DateTimeField(db_index=True)
    readings = models.PositiveIntegerField(default=0)
    nics = models.PositiveIntegerField(default=0)
    events = models.PositiveIntegerField(default=0)
    facility = models.PositiveIntegerField(default=0)
    faults = models.PositiveIntegerField(default=0)

    class Meta:
        # Per cluster: one cluster's agents cannot, by guessing or replaying ids, make another's batches duplicates.
        constraints = [
            models.UniqueConstraint(fields=["cluster", "batch_id"], name="ingest_batch_unique_per_cluster")
        ]

    def __str__(self):
        return str(self.batch_id)


class GPUState(models.Model):
    """The latest reading of a GPU and the prediction features updated as readings arrive (docs/prediction.md)."""

    gpu = models.OneToOneField("fleet.GPU", on_delete=models.CASCADE, primary_key=True, related_name="state")
    node = models.ForeignKey("fleet.Node", on_delete=models.CASCADE, related_name="gpu_states")
    ts = models.DateTimeField()
    fields = models.JSONField(default=dict)
    temperature = models.FloatField(null=True)
    power = models.FloatField(null=True)
    utilization = models.FloatField(null=True)
    sbe_total = models.BigIntegerField(default=0)
    dbe_total = models.BigIntegerField(default=0)
    remapped_rows = models.BigIntegerField(default=0)
    nvlink_errors = models.BigIntegerField(default=0)
    nvlink_recovery_errors = models.BigIntegerField(default=0)
    throttle_reasons = models.BigIntegerField(default=0)
    recovery_action = models.CharField(max_length=30, blank=True)
    # features (exponentially weighted, per hour where a rate)
    temperature_ewma = models.FloatField(null=True, help_text="fast average (time constant 2 min)")
    temperature_slow = models.FloatField(null=True, help_text="slow average (time constant 20 min)")
    temperature_trend = models.FloatField(
        default=0.0, help_text="°C per hour, from the fast and slow averages"
    )
    sbe_rate = models.FloatField(default=0.0, help_text="corrected ECC errors per hour, EWMA")
    remap_rate = models.FloatField(default=0.0, help_text="remapped rows per hour, EWMA")
    nvlink_rate = models.FloatField(default=0.0, help_text="NVLink errors per hour, EWMA")
    throttle_share = models.FloatField(
        default=0.0, help_text="share of readings with a thermal/power throttle, EWMA"
    )
    samples = models.PositiveIntegerField(default=0)

    def __str__(self):
        return f"gpu {self.gpu_id} @ {self.ts:%H:%M:%S}"


class NICState(models.Model):
    nic = models.OneToOneField("fleet.NIC", on_delete=models.CASCADE, primary_key=True, related_name="state")
    node = models.ForeignKey("fleet.Node", on_delete=models.CASCADE, related_name="nic_states")
    ts = models.DateTimeField()
    link_state = models.CharField(max_length=10)
    fields = models.JSONField(default=dict)
    link_downed = models.BigIntegerField(default=0)
    symbol_errors = models.BigIntegerField(default=0)
    link_error_recovery = models.BigIntegerField(default=0)
    port_rcv_errors = models.BigIntegerField(default=0)
    # features
    symbol_rate = models.FloatField(default=0.0, help_text="symbol errors per hour, EWMA")
    recovery_rate = models.FloatField(default=0.0, help_text="link error recoveries per hour, EWMA")
    rcv_error_rate = models.FloatField(default=0.0, help_text="port receive errors per hour, EWMA")
    xmit_wait = models.BigIntegerField(default=0, help_text="the port_xmit_wait counter at the last reading")
    congestion_rate = models.FloatField(
        default=0.0, help_text="port_xmit_wait ticks per hour, EWMA (congestion)"
    )
    down_seconds = models.FloatField(default=0.0, help_text="cumulative time observed down")
    flaps = models.PositiveIntegerField(default=0)
    errors_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="the last reading with the link down or a new error (none: never seen)",
    )

    def __str__(self):
        return f"nic {self.nic_id} {self.link_state}"


class GPUSample(models.Model):
    """One raw GPU reading, kept for TELEMETRY_RAW_RETENTION_HOURS."""

    ts = models.DateTimeField()
    gpu_id = models.BigIntegerField()
    temperature = models.FloatField(null=True)
    power = models.FloatField(null=True)
    utilization = models.FloatField(null=True)
    sbe_total = models.BigIntegerField(null=True)
    dbe_total = models.BigIntegerField(null=True)
    nvlink_errors = models.BigIntegerField(null=True)
    throttle_reasons = models.BigIntegerField(null=True)
    memory_used = models.BigIntegerField(null=True, help_text="framebuffer memory in use, bytes")

    class Meta:
        indexes = [models.Index(fields=["gpu_id", "ts"]), models.Index(fields=["ts"])]

    def __str__(self):
        return f"gpu {self.gpu_id} @ {self.ts}"


class NICSample(models.Model):
    """One raw NIC reading, kept for TELEMETRY_RAW_RETENTION_HOURS: the counters the node page charts, as the
    agent sends them (totals since boot), none where the NIC reports none of a group's counters."""

    ts = models.DateTimeField()
    nic_id = models.BigIntegerField()
    rx_bytes = models.BigIntegerField(null=True)
    tx_bytes = models.BigIntegerField(null=True)
    errors = models.BigIntegerField(
        null=True, help_text="rx_errors + tx_errors + symbol_error + port_rcv_errors, those reported"
    )
    drops = models.BigIntegerField(
        null=True, help_text="rx_dropped + tx_dropped + port_xmit_discards, those reported"
    )
    link_changes = models.BigIntegerField(
        null=True, help_text="carrier_changes (a netdev), else link_downed (an InfiniBand port)"
    )

    class Meta:
        indexes = [models.Index(fields=["nic_id", "ts"]), models.Index(fields=["ts"])]

    def __str__(self):
        return f"nic {self.nic_id} @ {self.ts}"


class NodeMinute(models.Model):
    """Per node and minute: the downsampled history charts read, kept for TELEMETRY_HISTORY_DAYS."""

    node = models.ForeignKey("fleet.Node", on_delete=models.CASCADE, related_name="minutes")
    minute = models.DateTimeField()
    samples = models.PositiveIntegerField(default=0)
    temperature_max = models.FloatField(null=True)
    temperature_sum = models.FloatField(default=0.0)
    power_sum = models.FloatField(default=0.0)
    utilization_sum = models.FloatField(default=0.0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "minute"], name="node_minute_unique")]
        indexes = [models.Index(fields=["minute"])]

    def __str__(self):
        return f"{self.node_id} {self.minute:%H:%M}"


class FacilitySample(models.Model):
    """A facility reading (Redfish chassis, CDU, PDU) for a node, rack or row."""

    cluster = models.ForeignKey("fleet.Cluster", on_delete=models.CASCADE, related_name="facility_samples")
    ts = models.DateTimeField()
    source = models.CharField(max_length=20)
    scope = models.CharField(max_length=10)
    target = models.CharField(max_length=100)
    device = models.CharField(max_length=200, blank=True)
    sensor = models.CharField(max_length=200, blank=True)
    metric = models.CharField(max_length=60)
    value = models.FloatField()
    health = models.CharField(max_length=20, blank=True)

    class Meta:
        indexes = [
            models.Index(fields=["cluster", "scope", "target", "metric", "ts"]),
            models.Index(fields=["ts"]),
        ]

    def __str__(self):
        return f"{self.scope}:{self.target} {self.metric}={self.value}"


class FacilityState(models.Model):
    """The latest value and trend of one facility series (per cluster, scope, target, device, sensor, metric)."""

    cluster = models.ForeignKey("fleet.Cluster", on_delete=models.CASCADE, related_name="facility_states")
    scope = models.CharField(max_length=10)
    target = models.CharField(max_length=100)
    series = models.CharField(max_length=420, help_text="device|sensor|metric")
    metric = models.CharField(max_length=60)
    ts = models.DateTimeField()
    value = models.FloatField()
    ewma = models.FloatField()
    trend = models.FloatField(default=0.0, help_text="units per hour, EWMA")
    baseline = models.FloatField(help_text="slow EWMA: what the series normally reads")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "scope", "target", "series"], name="facility_state_unique"
            )
        ]

    def __str__(self):
        return f"{self.scope}:{self.target} {self.series}"


class AlertRecord(models.Model):
    """One Alertmanager alert (fingerprint + start) and the fault its firing opened."""

    fingerprint = models.CharField(max_length=64)
    starts_at = models.DateTimeField(null=True, blank=True)
    alertname = models.CharField(max_length=200, blank=True)
    fault = models.ForeignKey(
        "jobs.FaultEvent", null=True, blank=True, on_delete=models.SET_NULL, related_name="alerts"
    )
    status = models.CharField(max_length=10)
    received_at = models.DateTimeField(auto_now_add=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    labels = models.JSONField(default=dict)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["fingerprint", "starts_at"], name="alert_fingerprint_start_unique"
            )
        ]

    def __str__(self):
        return f"{self.alertname} {self.fingerprint} {self.status}"


class NotificationChannel(models.Model):
    """Where Lockstep tells humans what they must see: a generic JSON webhook or a Slack-compatible one."""

    Kind = NotificationChannelKind  # the model's name for its choices (telemetry.choices)

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.GENERIC)
    url = models.URLField(max_length=500)
    # Which notices (telemetry.services.notifications.RULES); empty means all of them.
    rules = models.JSONField(default=list, blank=True)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class NotificationCursor(models.Model):
    """How far the dispatcher has read the ``fleet`` topic of the event outbox."""

    name = models.CharField(max_length=40, primary_key=True)
    last_seq = models.BigIntegerField(default=0)

    def __str__(self):
        return f"{self.name}@{self.last_seq}"


class NotificationDelivery(models.Model):
    """One notice to one channel: the delivery log, with retries on deadlines kept in the row."""

    State = DeliveryState

    channel = models.ForeignKey(NotificationChannel, on_delete=models.CASCADE, related_name="deliveries")
    event_id = models.BigIntegerField()
    rule = models.CharField(max_length=40)
    summary = models.CharField(max_length=500)
    payload = models.JSONField(default=dict)
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_status = models.IntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["channel", "event_id"], name="delivery_once_per_event")
        ]
        indexes = [models.Index(fields=["state", "next_attempt_at"])]

    def __str__(self):
        return f"{self.rule} → {self.channel_id} ({self.state})"


class RiskSample(models.Model):
    """A node's risk score over time (kept where it matters: recorded when it changes or is high)."""

    node = models.ForeignKey("fleet.Node", on_delete=models.CASCADE, related_name="risk_samples")
    ts = models.DateTimeField()
    score = models.FloatField()

    class Meta:
        indexes = [models.Index(fields=["node", "ts"]), models.Index(fields=["ts"])]

    def __str__(self):
        return f"{self.node_id} {self.score:.2f} @ {self.ts:%H:%M}"


class Prediction(models.Model):
    """A prediction that a node will fail within a horizon: auditable, with what was done and what happened."""

    Outcome = PredictionOutcome

    node = models.ForeignKey("fleet.Node", on_delete=models.CASCADE, related_name="predictions")
    cluster = models.ForeignKey("fleet.Cluster", on_delete=models.CASCADE, related_name="predictions")
    score = models.FloatField()
    threshold = models.FloatField()
    horizon_hours = models.FloatField()
    predicted_at = models.DateTimeField()
    cause = models.CharField(max_length=300)
    cause_kind = models.CharField(max_length=20)
    evidence = models.JSONField(default=dict)
    fault = models.ForeignKey(
        "jobs.FaultEvent",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="the predicted_failure fault the planner acted on",
    )
    action_taken = models.CharField(max_length=40, blank=True)
    outcome = models.CharField(max_length=10, choices=Outcome.choices, default=Outcome.OPEN)
    outcome_at = models.DateTimeField(null=True, blank=True)
    failure = models.ForeignKey(
        "jobs.FaultEvent",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="the hardware fault that came true",
    )
    lead_seconds = models.FloatField(null=True, blank=True)

    tenant_scope = None  # fleet-wide analysis: provider roles

    class Meta:
        ordering = ["-predicted_at", "-id"]
        indexes = [models.Index(fields=["outcome", "predicted_at"])]

    def __str__(self):
        return f"node {self.node_id} {self.score:.2f} ({self.outcome})"
