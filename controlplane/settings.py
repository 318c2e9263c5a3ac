"""Lockstep settings, read from the environment (django-environ).

Every environment variable Lockstep reads is declared once in ``ENVIRONMENT``
below with its default and meaning; the README's configuration table and the
docker-compose test are checked against that list.
"""

import ipaddress
import os
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlparse

import environ
from django.core.exceptions import ImproperlyConfigured
from kombu import Queue

from controlplane.openapi_tags import TAGS as OPENAPI_TAGS

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

# name -> (cast, default, meaning). The single source of truth for configuration.
ENVIRONMENT: dict[str, tuple[type, object, str]] = {
    "DEBUG": (bool, False, "Debug pages and autoreloading static files. Never on in production."),
    "DEBUG_ERROR_PAGES": (
        bool,
        False,
        "With DEBUG on, answer a 404 or a server error with Django's debug page (every URL pattern, the traceback) instead of the site's own error pages; off, the site's pages answer and tracebacks go to the log only.",
    ),
    "SECRET_KEY": (
        str,
        "",
        "Django's signing key (sessions, CSRF) and, unless CREDENTIALS_KEYS is set, the source of the key that encrypts cluster credentials. Required when DEBUG is off; make one with `python -c 'import secrets; print(secrets.token_urlsafe(50))'`.",
    ),
    "SECRET_KEY_FALLBACKS": (
        list,
        [],
        "Earlier SECRET_KEYs, comma-separated, still accepted while rotating: sessions signed with them stay valid and credentials encrypted with keys derived from them still decrypt (run `manage.py rotate_credentials`, then drop them).",
    ),
    "ALLOWED_HOSTS": (
        list,
        ["127.0.0.1", "localhost"],
        "Comma-separated host names the web process answers to.",
    ),
    "CSRF_TRUSTED_ORIGINS": (
        list,
        [],
        "Comma-separated origins (scheme://host[:port]) trusted for form posts behind a proxy.",
    ),
    "DATABASE_URL": (
        str,
        "sqlite:///var/lockstep.sqlite3",
        "Database URL. The embedded default is a SQLite file (WAL); use postgres://user:pass@host:5432/db in production.",
    ),
    "DATABASE_POOL_SIZE": (
        int,
        0,
        "PostgreSQL connections a process keeps in a pool (psycopg_pool); 0: one persistent connection per thread instead. The web process (controlplane/asgi.py) uses 4 unless this is set, and runs each request's synchronous code on one of twice as many long-lived threads (at least 4): the threads' connections come from the pool and go back to it after each request. Workers run one task at a time and keep 0.",
    ),
    "REDIS_URL": (str, "redis://127.0.0.1:6379/0", "Redis for the Celery broker and the Channels layer."),
    "CELERY_BROKER_URL": (str, "", "Celery broker; defaults to REDIS_URL."),
    "CELERY_VISIBILITY_TIMEOUT": (
        int,
        300,
        "Seconds before an unacknowledged Celery message is redelivered (Redis broker).",
    ),
    "CELERY_TASK_TIME_LIMIT": (int, 120, "Hard time limit of a Celery task, seconds."),
    "CELERY_ALWAYS_EAGER": (
        bool,
        False,
        "Run tasks in-process (only for quick local experiments; tests use a real worker).",
    ),
    "EVENT_RETENTION_DAYS": (float, 7.0, "How long the event outbox keeps events for catch-up, days."),
    "AUDIT_RETENTION_DAYS": (int, 365, "How long audit entries are kept."),
    "OUTBOX_SWEEP_SECONDS": (int, 5, "How often beat re-sends events the relay could not deliver."),
    "OUTBOX_RELAY_TIMEOUT": (
        float,
        1.0,
        "Seconds the after-commit relay waits for Redis before leaving an event to the sweep.",
    ),
    "READYZ_TIMEOUT": (float, 2.0, "Seconds each /readyz check may take before it counts as failed."),
    "HEARTBEAT_SECONDS": (int, 5, "How often workers and beat write their heartbeat to Redis."),
    "TOKEN_LAST_USED_RESOLUTION": (
        int,
        60,
        "Seconds between writes of a token's last-used time (API, agent, job and launcher tokens).",
    ),
    "LOG_LEVEL": (str, "INFO", "Root log level."),
    "LOG_ROUTINE_TASKS": (
        bool,
        False,
        "Log beat's routine tasks (the sweeps it sends every few seconds: sent, received, succeeded) at INFO like any task; off, they are DEBUG records, so the log at INFO shows the work that matters.",
    ),
    "PLAIN_HTTP": (
        bool,
        False,
        "Serve plain HTTP with DEBUG off: no redirect to HTTPS, no HSTS, cookies without Secure. Only for a local run on localhost (docker compose sets it) and the test suite; never in production. DEBUG=true implies it.",
    ),
    "SECURE_SSL_REDIRECT": (
        bool,
        True,
        "Redirect plain HTTP to HTTPS (unless DEBUG or PLAIN_HTTP). Turn off only where the proxy in front already redirects.",
    ),
    "SECURE_HSTS_SECONDS": (
        int,
        31536000,
        "Strict-Transport-Security max-age, seconds (unless DEBUG or PLAIN_HTTP); start low (300) on a new domain, 0 turns HSTS off.",
    ),
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": (bool, True, "HSTS covers every subdomain of the host too."),
    "SECURE_HSTS_PRELOAD": (
        bool,
        True,
        "Send HSTS with `preload` (lets the domain be submitted to browsers' preload lists).",
    ),
    "TRUST_X_FORWARDED_PROTO": (
        bool,
        False,
        "Believe `X-Forwarded-Proto: https` from the proxy in front (SECURE_PROXY_SSL_HEADER). Set only behind a proxy that sets the header and strips it from clients; uvicorn's --forwarded-allow-ips does the same job.",
    ),
    "CREDENTIALS_KEYS": (
        list,
        [],
        "Fernet keys, comma-separated, newest first, that encrypt cluster credentials at rest: the first encrypts, all decrypt. Empty: keys derived from SECRET_KEY and SECRET_KEY_FALLBACKS. New key: `python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'`.",
    ),
    "LOGIN_RATE": (
        str,
        "5/min",
        "Login attempts allowed per user name and client address (n/s, n/min, n/hour, n/day); more are answered 429 with Retry-After.",
    ),
    "LOGIN_ADDRESS_RATE": (
        str,
        "60/min",
        "Login attempts allowed per client address, whatever the user name.",
    ),
    "TOKEN_CREATE_RATE": (
        str,
        "20/hour",
        "API and agent tokens one user may create or rotate (page or API); more are answered 429 with Retry-After.",
    ),
    "DEMO_ADMIN_USERNAME": (str, "admin", "User name of the demo provider-admin that `make run` creates."),
    "LOCAL_ENV_FILE": (
        str,
        "var/local.env",
        "The local run's settings file (DEBUG, a generated SECRET_KEY, the database, demo-sized retention) that `make run` writes on first start; every process of the checkout reads it unless its environment sets SECRET_KEY, and a variable set in the environment wins over its line there. Empty: no file.",
    ),
    "RETENTION_PRUNE_SECONDS": (
        int,
        3600,
        "How often beat prunes telemetry, events and audit entries past their retention.",
    ),
    "TELEMETRY_MAX_BATCH_BYTES": (
        int,
        8 * 1024 * 1024,
        "Largest telemetry batch accepted, bytes (413 above).",
    ),
    "TELEMETRY_MAX_SKEW_SECONDS": (
        int,
        300,
        "How far an agent's clock may be from the server's before its batch is refused.",
    ),
    "TELEMETRY_RAW_RETENTION_HOURS": (
        float,
        24.0,
        "How long raw GPU and NIC samples are kept, hours (and the oldest reading a batch may carry).",
    ),
    "TELEMETRY_HISTORY_DAYS": (
        float,
        30.0,
        "How long the per-node, per-minute history for charts and the facility series are kept, days.",
    ),
    "TELEMETRY_THERMAL_CELSIUS": (float, 90.0, "GPU temperature at which ingest reports a thermal fault."),
    "TELEMETRY_SYMBOL_ERRORS_PER_HOUR": (
        float,
        100.0,
        "NIC symbol-error rate above which a link counts as degraded.",
    ),
    "RISK_SWEEP_SECONDS": (int, 60, "How often beat scores every node's risk of failing soon."),
    "PREDICTION_HORIZON_HOURS": (
        float,
        24.0,
        "How far ahead a failure prediction looks, in the fault model's time (on a simulated cluster divided by SIMULATOR_ACCELERATION); it is judged true if the node fails within it.",
    ),
    "SIMULATOR_ACCELERATION": (
        float,
        600.0,
        "How much faster than real time the simulator's faults strike (demo time compression).",
    ),
    "SIMULATOR_SHOWCASE_SECONDS": (
        float,
        60.0,
        "Seconds after `simulate run` starts that the demo stages one NIC failure under the largest protected "
        "job, so a new fleet shows a recovery other than a restart early; negative: none.",
    ),
    "DRIFT_SWEEP_SECONDS": (int, 60, "How often beat runs the drift sweep over every cluster."),
    "DRIFT_MAX_CORRECTIONS": (
        int,
        3,
        "Failed corrections of one drift finding before it is reported and left alone.",
    ),
    "ROLLOUT_TICK_SECONDS": (
        int,
        5,
        "How often beat moves every running rollout one step (and re-queues lost steps).",
    ),
    "XID_CATALOG": (
        str,
        "",
        "Path of NVIDIA's Xid catalogue CSV that fault triage reads; empty: the copy in the repository (data/xid/nvidia_xid_catalog.csv).",
    ),
    "FAULT_CORRELATION_SECONDS": (
        float,
        60.0,
        "Reports of the same node, device, fault kind and code within this many seconds are one FaultEvent; a node's incident stays open while a report is younger than this (docs/incidents.md).",
    ),
    "FAULT_SWEEP_SECONDS": (
        int,
        3,
        "How often beat re-enqueues fault events still new, and how old they must be.",
    ),
    "RECOVERY_ADVANCE_SECONDS": (
        int,
        1,
        "How often beat advances running recovery actions, snapshots and the escalation ladder.",
    ),
    "SLURM_SYNC_SECONDS": (
        int,
        2,
        "How often beat reads every Slurm cluster's nodes and jobs (sinfo/squeue --json): new nodes and jobs, dead nodes as faults, ended jobs.",
    ),
    "ESCALATION_STRIKES": (
        int,
        3,
        "Non-fatal faults on one node within ESCALATION_WINDOW_SECONDS that quarantine it.",
    ),
    "ESCALATION_WINDOW_SECONDS": (int, 3600, "The window in which repeated non-fatal faults escalate."),
    "NODE_COOLDOWN_SECONDS": (
        int,
        1800,
        "After a job migrates off a node, no job is migrated onto it for this long (anti-thrash).",
    ),
    "RECOVERY_DEADLINE_FACTOR": (
        float,
        3.0,
        "A recovery action fails as timed out when not done within the larger of this many times its estimate and its estimate + RECOVERY_DEADLINE_EXTRA_SECONDS.",
    ),
    "RECOVERY_DEADLINE_EXTRA_SECONDS": (float, 60.0, "See RECOVERY_DEADLINE_FACTOR (docs/incidents.md)."),
    "RECOVERY_RESTART_RETRIES": (
        int,
        3,
        "How often a failed restart from checkpoint is retried before the job is Failed.",
    ),
    "RECOVERY_RETRY_BACKOFF_SECONDS": (
        float,
        30.0,
        "The first retry of a failed restart waits this long; each later one twice as long.",
    ),
    "RECOVERY_SPARE_WAIT_SECONDS": (
        float,
        86400.0,
        "How long a restart that finds no healthy spare for a dead node's workers waits for one (a repaired node coming back, its own included), counted from the fault; then it fails and the job with it. 0: fail at once.",
    ),
    "DRAIN_DEADLINE_SECONDS": (
        float,
        1800.0,
        "A drain whose node still holds a job this long after it began is announced (node.drain_overdue, a notification), once per drain; the node stays draining and the page says what it waits for.",
    ),
    "DRAIN_SWEEP_SECONDS": (
        int,
        5,
        "How often beat steps every draining node: raises its drain request if missing, completes a drain no job holds up, announces an overdue one.",
    ),
    "RECOVERY_SPARE_POLL_SECONDS": (
        float,
        300.0,
        "How often a restart waiting for a spare looks again; a node returned to service makes it look at once.",
    ),
    "PROACTIVE_PRECISION_PRIOR": (
        float,
        0.5,
        "Until enough predictions of a score band are judged, a proactive move's expected saving assumes this precision.",
    ),
    "PROACTIVE_PRECISION_MIN_JUDGED": (
        int,
        20,
        "How many judged predictions of a score band its measured precision needs before it replaces the prior.",
    ),
    "NIC_REPAIR_SECONDS": (
        int,
        1800,
        "Expected time until a failed NIC is repaired: the planner's default for how long a failed-over job runs degraded, until measured failbacks replace it.",
    ),
    "LINK_DEGRADED_SECONDS": (
        int,
        600,
        "Expected time a grey link (errors rising, link up) stays degraded: the planner's default until measured failbacks replace it.",
    ),
    "LINK_CLEAN_SECONDS": (
        int,
        120,
        "A degraded or failed link counts as healthy again (the job fails back) after it stayed up with no new error for this long.",
    ),
    "AGENT_INTERVAL_SECONDS": (
        float,
        10.0,
        "How often node agents report (the agent's --interval): silence is judged in these intervals.",
    ),
    "SILENCE_INTERVALS": (
        int,
        3,
        "A node that reported before and then stays silent for this many agent intervals gets a node_unreachable fault (source heartbeat).",
    ),
    "HANG_STEP_MULTIPLE": (
        float,
        10.0,
        "A job that reported progress and then stays silent for this many times its median step time gets a hang fault.",
    ),
    "HANG_FLOOR_SECONDS": (float, 120.0, "The least silence judged a hang, whatever the job's step time."),
    "RECOVERY_ESTIMATE_MIN_SAMPLES": (
        int,
        5,
        "Completed recoveries of a kind on a cluster before their measured durations replace the planner's defaults.",
    ),
    "RESTART_BASELINE_MIN_SAMPLES": (
        int,
        3,
        "Restarts measured on a cluster (fault to the job's first step again) for jobs of a size before their average replaces the cluster's assumed restart overhead in the GPU-hours baseline.",
    ),
    "RANK_REPLACEMENT_DEADLINE_SECONDS": (
        float,
        60.0,
        "How long a rank replacement waits for the job's runtime to report the standby in place before it falls back to restoring the whole job.",
    ),
    # validation of repaired nodes, the rollout gate (docs/fleet.md)
    "ESCALATION_CLEAN_TELEMETRY_SECONDS": (
        int,
        300,
        "After a repaired node's health check passes, a node with an agent must report for this long with no hardware fault before it returns to service.",
    ),
    "ROLLOUT_GATE_SIGNIFICANCE": (
        float,
        0.005,
        "The rollout fault-rate gate fails a batch only when its hardware-fault count since the change is this improbable under the rate before it (one-sided exact conditional binomial test).",
    ),
    "ROLLOUT_GATE_BASELINE_HOURS": (
        float,
        168.0,
        "How far back before a batch started the gate counts faults for its background rate (at least as long as the batch's own window).",
    ),
    # hardening (docs/security.md)
    "WS_REVALIDATE_SECONDS": (
        float,
        60.0,
        "How often an open websocket checks its credential (token, session, user) and its topics' permissions again; a revocation closes it at once.",
    ),
    "WHATIF_MAX_PER_USER": (
        int,
        1,
        "What-if replays one user may have queued or running at once (429 above).",
    ),
    "WHATIF_MAX_RUNNING": (int, 2, "What-if replays queued or running at once in all (429 above)."),
    "WS_MAX_PER_USER": (
        int,
        20,
        "Websockets one user (or token) may hold open at once; the next is closed at once with code 4429 (docs/security.md).",
    ),
    "BLUEPRINT_YAML_MAX_BYTES": (
        int,
        256 * 1024,
        "The largest blueprint YAML document (or version content) Lockstep parses, in bytes; larger ones are refused unread (400).",
    ),
    "BLUEPRINT_YAML_MAX_NODES": (
        int,
        20_000,
        "The most YAML nodes (scalars, lists, mappings) a blueprint document may hold; parsing stops at the first over it (400), so one document holds a web thread for a bounded time.",
    ),
    "HELM_PENDING_DEADLINE_SECONDS": (
        int,
        900,
        "How long a Helm release may stay pending-install, pending-upgrade or pending-rollback (a crashed upgrade leaves it so) before the Kubernetes driver reports it Degraded and its next apply rolls it back and retries; a cluster's `pending_deadline_seconds` connection setting overrides it.",
    ),
    "BLUEPRINT_SOURCE_SWEEP_SECONDS": (
        int,
        15,
        "How often beat looks for blueprint sources whose poll is due (each source polls at its own `poll_seconds`).",
    ),
    "BLUEPRINT_SOURCE_GIT_TIMEOUT": (
        int,
        60,
        "Seconds one git command of a blueprint source poll may take (a fetch included) before the poll fails with that reason.",
    ),
    "BLUEPRINT_SOURCE_CACHE_DIR": (
        str,
        "",
        "Where workers keep their copies of blueprint sources' git repositories (one bare repository each; safe to delete). Empty: var/blueprint-sources.",
    ),
    "BLUEPRINT_SOURCE_ALLOW_FILE": (
        bool,
        False,
        "Let blueprint sources be file:// repositories on the workers' disk. Only for tests: users' source URLs are otherwise https:// to public addresses (the outbound-URL rule).",
    ),
    "FORWARDED_ALLOW_IPS": (
        str,
        "",
        "Addresses of the proxies whose X-Forwarded-For and X-Forwarded-Proto uvicorn believes (comma-separated IPs or networks; uvicorn reads this variable). Empty: none, not even 127.0.0.1, so a client on the host cannot pick the address the login rate limit keys on. Set it to the proxy's address behind a proxy.",
    ),
    "OUTBOUND_ALLOWED_NETWORKS": (
        str,
        "",
        "Ranges that user-set URLs the workers fetch (notification channels, add-on repositories) may reach although they are not public: comma-separated networks such as 10.20.0.0/16 or 127.0.0.1/32 (a lab hook). Empty: loopback, private, link-local and other internal addresses are refused, when a URL is saved and when it is fetched (controlplane/outbound.py).",
    ),
    # Single sign-on with OpenID Connect (tenancy/sso.py, mozilla-django-oidc). Off while OIDC_CLIENT_ID is empty.
    "OIDC_CLIENT_ID": (
        str,
        "",
        "Lockstep's client id at the OpenID Connect provider. Empty: single sign-on is off and the login page has only the local form; set, every OIDC_*_ENDPOINT must be set too.",
    ),
    "OIDC_CLIENT_SECRET": (str, "", "Lockstep's client secret at the OpenID Connect provider."),
    "OIDC_AUTHORIZATION_ENDPOINT": (
        str,
        "",
        "The provider's authorization endpoint (authorization_endpoint of its /.well-known/openid-configuration), where the browser is sent to log in.",
    ),
    "OIDC_TOKEN_ENDPOINT": (str, "", "The provider's token endpoint (token_endpoint), which Lockstep calls."),
    "OIDC_USERINFO_ENDPOINT": (
        str,
        "",
        "The provider's userinfo endpoint (userinfo_endpoint), whose answer carries the groups claim.",
    ),
    "OIDC_JWKS_ENDPOINT": (
        str,
        "",
        "The provider's key set (jwks_uri), which the ID token's signature is checked against.",
    ),
    "OIDC_SIGN_ALGO": (str, "RS256", "The algorithm the provider signs ID tokens with (RS256, ES256, …)."),
    "OIDC_SCOPES": (
        str,
        "openid email profile groups",
        "The scopes Lockstep asks for, space-separated: enough for the provider to send the groups claim.",
    ),
    "OIDC_GROUPS_CLAIM": (
        str,
        "groups",
        "The userinfo claim that lists the user's groups at the provider (a list, or one string).",
    ),
    "OIDC_GROUP_ROLES": (
        str,
        "",
        "Which provider group gives which Lockstep role, comma-separated GROUP=ROLE for provider roles and GROUP=ROLE:TENANT-SLUG for tenant roles, e.g. `sre=operator,acme-admins=tenant-admin:acme`. A user gets the strongest role its groups give, again at each login; one whose groups give none, or tenant roles in two tenants, is refused and no account is made.",
    ),
    "OIDC_PROVIDER_NAME": (
        str,
        "single sign-on",
        "What the login page's button names the provider: `Log in with <name>`.",
    ),
}

env = environ.Env(**{name: (cast, default) for name, (cast, default, _) in ENVIRONMENT.items()})
if (BASE_DIR / ".env").exists():
    environ.Env.read_env(BASE_DIR / ".env")


def local_env_file(environment=None) -> Path | None:
    """The local run's settings file (var/local.env, written by `make run`) this process reads, or None.

    Only a process that brings no SECRET_KEY of its own reads it: production, CI, docker compose and the test
    suite (controlplane/testing/settings.py) set their own key, and so never pick up a checkout's local run.
    LOCAL_ENV_FILE names another file, or, empty, none.
    """
    environment = os.environ if environment is None else environment
    if environment.get("SECRET_KEY"):
        return None
    path = environment.get("LOCAL_ENV_FILE", str(VAR_DIR / "local.env"))
    if not path:
        return None
    path = Path(path)
    if not path.is_absolute():
        path = BASE_DIR / path
    return path if path.is_file() else None


# A variable set in the environment wins over its line in the file (read_env only sets what is unset).
LOCAL_ENV_FILE = local_env_file()
if LOCAL_ENV_FILE is not None:
    environ.Env.read_env(LOCAL_ENV_FILE)

DEBUG = env("DEBUG")
# The site's error pages answer with DEBUG on too (controlplane/error_pages.py), unless this asks for Django's.
DEBUG_ERROR_PAGES = env("DEBUG_ERROR_PAGES")
# Production is DEBUG off: it runs on its own key. A DEBUG run (`make run`) may fall back to a fixed development
# key, which `check --deploy` reports (django-insecure-).
SECRET_KEY = env("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off (see README, Configuration).")
    SECRET_KEY = "django-insecure-lockstep-development-key-set-SECRET_KEY-in-production"
if not DEBUG and len(SECRET_KEY) < 32:
    raise ImproperlyConfigured(
        "SECRET_KEY must be at least 32 characters when DEBUG is off (see README, Configuration)."
    )
SECRET_KEY_FALLBACKS = env("SECRET_KEY_FALLBACKS")
ALLOWED_HOSTS = env("ALLOWED_HOSTS")
CSRF_TRUSTED_ORIGINS = env("CSRF_TRUSTED_ORIGINS")
CSRF_FAILURE_VIEW = "controlplane.error_pages.csrf_failure"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_tables2",
    "channels",
    "csp",
    "django_ratelimit",
    "controlplane",
    "tenancy",
    "fleet",
    "jobs",
    "telemetry",
    "simulator",
    "home",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "controlplane.security_csp.ContentSecurityPolicyMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "controlplane.error_pages.ApiErrorMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "controlplane.context.RequestContextMiddleware",
    "controlplane.error_pages.ErrorPageMiddleware",
    "controlplane.middleware.DatabaseErrorMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "controlplane.urls"
ASGI_APPLICATION = "controlplane.asgi.application"
WSGI_APPLICATION = "controlplane.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "controlplane.context_processors.navigation_context",
            ],
        },
    },
]

# --- database -------------------------------------------------------------------------------------------
DATABASES = {"default": env.db_url_config(env("DATABASE_URL"))}
_db = DATABASES["default"]
if _db["ENGINE"] == "django.db.backends.sqlite3":
    name = Path(_db["NAME"])
    if not name.is_absolute() and str(name) != ":memory:":
        name = BASE_DIR / name
    _db["NAME"] = str(name)
    if str(name) != ":memory:":
        name.parent.mkdir(parents=True, exist_ok=True)
    # WAL lets readers run beside the one writer; IMMEDIATE takes the write lock at BEGIN so two processes
    # never both upgrade a read lock and deadlock; the busy timeout waits for the lock instead of failing.
    _db["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=20000;",
    }
else:
    _db.setdefault("OPTIONS", {}).setdefault("connect_timeout", 5)
    # Statements run with server-side binding five times are prepared (telemetry ingest's two; Django's own
    # queries bind client-side and are never prepared). Behind PgBouncer < 1.21 in transaction mode, set it off.
    _db["OPTIONS"].setdefault("prepare_threshold", 5)
    if env("DATABASE_POOL_SIZE") > 0:
        # A pool per process, shared by the threads requests run on; Django has the pool check a connection
        # before handing it out, so one broken by a database restart is replaced rather than failing a request.
        _db["OPTIONS"]["pool"] = {"min_size": 1, "max_size": env("DATABASE_POOL_SIZE"), "timeout": 10}
        _db["CONN_MAX_AGE"] = 0
    else:
        _db["CONN_MAX_AGE"] = 60
        _db["CONN_HEALTH_CHECKS"] = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- auth -----------------------------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

# Single sign-on (tenancy/sso.py): on when OIDC_CLIENT_ID is set; the local login form stays (the first admin
# logs in there). mozilla-django-oidc reads the OIDC_RP_* and OIDC_OP_* names.
OIDC_RP_CLIENT_ID = env("OIDC_CLIENT_ID")
SSO_ENABLED = bool(OIDC_RP_CLIENT_ID)
OIDC_RP_CLIENT_SECRET = env("OIDC_CLIENT_SECRET")
OIDC_OP_AUTHORIZATION_ENDPOINT = env("OIDC_AUTHORIZATION_ENDPOINT")
OIDC_OP_TOKEN_ENDPOINT = env("OIDC_TOKEN_ENDPOINT")
OIDC_OP_USER_ENDPOINT = env("OIDC_USERINFO_ENDPOINT")
OIDC_OP_JWKS_ENDPOINT = env("OIDC_JWKS_ENDPOINT")
if SSO_ENABLED and not all(
    (OIDC_OP_AUTHORIZATION_ENDPOINT, OIDC_OP_TOKEN_ENDPOINT, OIDC_OP_USER_ENDPOINT, OIDC_OP_JWKS_ENDPOINT)
):
    raise ImproperlyConfigured(
        "OIDC_CLIENT_ID is set: set OIDC_AUTHORIZATION_ENDPOINT, OIDC_TOKEN_ENDPOINT, OIDC_USERINFO_ENDPOINT and "
        "OIDC_JWKS_ENDPOINT too (see README, Configuration)."
    )
OIDC_RP_SIGN_ALGO = env("OIDC_SIGN_ALGO")
OIDC_RP_SCOPES = env("OIDC_SCOPES")
OIDC_GROUPS_CLAIM = env("OIDC_GROUPS_CLAIM")
OIDC_GROUP_ROLES = env("OIDC_GROUP_ROLES")
OIDC_PROVIDER_NAME = env("OIDC_PROVIDER_NAME")
OIDC_CALLBACK_CLASS = "tenancy.sso.CallbackView"
OIDC_USE_PKCE = True
OIDC_TIMEOUT = 10
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    *(["tenancy.sso.GroupRoleBackend"] if SSO_ENABLED else []),
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

# --- static files ---------------------------------------------------------------------------------------
STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATICFILES_FINDERS = [
    "django.contrib.staticfiles.finders.FileSystemFinder",
    "django.contrib.staticfiles.finders.AppDirectoriesFinder",
]
# After collectstatic (the image, `make run`), pages link content-hashed names that whitenoise serves gzipped and
# cacheable for a year, DEBUG or not; without a current collected tree, the sources as they are
# (controlplane/staticstorage.py).
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "controlplane.staticstorage.StaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG

# --- redis, celery, channels ----------------------------------------------------------------------------
REDIS_URL = env("REDIS_URL")
CELERY_BROKER_URL = env("CELERY_BROKER_URL") or REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_RESULT_EXPIRES = 3600
# One result backend object for all threads (its Redis connection pool is thread-safe). Without it Celery builds
# one per thread, scanning the installed packages' entry points each time; the web process runs every request on
# a new thread, so each task queued from a request paid for that scan (a fifth of a fault report's CPU).
CELERY_RESULT_BACKEND_THREAD_SAFE = True
CELERY_TASK_IGNORE_RESULT = True
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Keep a worker's database connection across tasks (Celery's Django fixup otherwise closes it around each
# task, and every task would open a new PostgreSQL session); connections are still checked before use.
CELERY_DB_REUSE_MAX = 1000
CELERY_TASK_TIME_LIMIT = env("CELERY_TASK_TIME_LIMIT")
CELERY_TASK_SOFT_TIME_LIMIT = max(1, CELERY_TASK_TIME_LIMIT - 10)
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env("CELERY_VISIBILITY_TIMEOUT")}
CELERY_RESULT_BACKEND_TRANSPORT_OPTIONS = {"visibility_timeout": env("CELERY_VISIBILITY_TIMEOUT")}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_ALWAYS_EAGER = env("CELERY_ALWAYS_EAGER")
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TIMEZONE = "UTC"
# Waits are deadlines stored in rows and checked here; no task is queued with a long countdown or eta.
# Queues by urgency (docs/operations.md): fault handling, recovery advance and the outbox on `faults`, which no
# long task occupies; what-if replays, the risk sweep and retention on `analytics`; the rest on `celery`. All three
# are declared, so a worker started without -Q consumes every one (a small deployment runs one worker).
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_TASK_QUEUES = [Queue("faults"), Queue("celery"), Queue("analytics")]
CELERY_TASK_ROUTES = {
    **{
        name: {"queue": "faults"}
        for name in (
            "jobs.fault_handle",
            "jobs.fault_sweep",
            "jobs.recovery_advance",
            "jobs.drain_request",
            "jobs.drains_advance",
            "jobs.silence_sweep",
            "jobs.links_fail_back",
            "jobs.snapshot_schedule",
            "controlplane.outbox_sweep",
        )
    },
    **{
        name: {"queue": "analytics"}
        for name in (
            "simulator.whatif",
            "simulator.whatif_sweep",
            "telemetry.risk_sweep",
            "telemetry.retention_prune",
            "controlplane.retention_prune",
        )
    },
}
WHATIF_MAX_PER_USER = env("WHATIF_MAX_PER_USER")
WHATIF_MAX_RUNNING = env("WHATIF_MAX_RUNNING")
WS_REVALIDATE_SECONDS = env("WS_REVALIDATE_SECONDS")
WS_MAX_PER_USER = env("WS_MAX_PER_USER")
BLUEPRINT_YAML_MAX_BYTES = env("BLUEPRINT_YAML_MAX_BYTES")
BLUEPRINT_YAML_MAX_NODES = env("BLUEPRINT_YAML_MAX_NODES")
HELM_PENDING_DEADLINE_SECONDS = env("HELM_PENDING_DEADLINE_SECONDS")
BLUEPRINT_SOURCE_GIT_TIMEOUT = env("BLUEPRINT_SOURCE_GIT_TIMEOUT")
BLUEPRINT_SOURCE_CACHE_DIR = env("BLUEPRINT_SOURCE_CACHE_DIR") or str(VAR_DIR / "blueprint-sources")
BLUEPRINT_SOURCE_ALLOW_FILE = env("BLUEPRINT_SOURCE_ALLOW_FILE")
try:  # a range written wrong stops the start rather than allowing something else
    OUTBOUND_ALLOWED_NETWORKS = [
        str(ipaddress.ip_network(network.strip()))
        for network in env("OUTBOUND_ALLOWED_NETWORKS").split(",")
        if network.strip()
    ]
except ValueError as error:
    raise ImproperlyConfigured(f"OUTBOUND_ALLOWED_NETWORKS: {error}") from None

CELERY_BEAT_SCHEDULE = {
    "outbox-sweep": {
        "task": "controlplane.outbox_sweep",
        "schedule": timedelta(seconds=env("OUTBOX_SWEEP_SECONDS")),
        "options": {"expires": env("OUTBOX_SWEEP_SECONDS") * 2},
    },
    "jobs-fault-sweep": {
        "task": "jobs.fault_sweep",
        "schedule": timedelta(seconds=env("FAULT_SWEEP_SECONDS")),
        "options": {"expires": env("FAULT_SWEEP_SECONDS") * 2},
    },
    "jobs-recovery-advance": {
        "task": "jobs.recovery_advance",
        "schedule": timedelta(seconds=env("RECOVERY_ADVANCE_SECONDS")),
        "options": {"expires": max(2, env("RECOVERY_ADVANCE_SECONDS") * 2)},
    },
    "jobs-drains-advance": {
        "task": "jobs.drains_advance",
        "schedule": timedelta(seconds=env("DRAIN_SWEEP_SECONDS")),
        "options": {"expires": env("DRAIN_SWEEP_SECONDS") * 2},
    },
    "jobs-silence-sweep": {
        "task": "jobs.silence_sweep",
        "schedule": timedelta(seconds=max(5.0, env("AGENT_INTERVAL_SECONDS"))),
        "options": {"expires": max(10.0, 2 * env("AGENT_INTERVAL_SECONDS"))},
    },
    "jobs-links-fail-back": {
        "task": "jobs.links_fail_back",
        "schedule": timedelta(seconds=10),
        "options": {"expires": 20},
    },
    "jobs-snapshot-schedule": {
        "task": "jobs.snapshot_schedule",
        "schedule": timedelta(seconds=30),
        "options": {"expires": 60},
    },
    "fleet-drift-sweep": {
        "task": "fleet.drift_sweep",
        "schedule": timedelta(seconds=env("DRIFT_SWEEP_SECONDS")),
        "options": {"expires": env("DRIFT_SWEEP_SECONDS")},
    },
    "fleet-blueprint-source-sweep": {
        "task": "fleet.blueprint_source_sweep",
        "schedule": timedelta(seconds=env("BLUEPRINT_SOURCE_SWEEP_SECONDS")),
        "options": {"expires": env("BLUEPRINT_SOURCE_SWEEP_SECONDS") * 2},
    },
    "fleet-rollout-sweep": {
        "task": "fleet.rollout_sweep",
        "schedule": timedelta(seconds=env("ROLLOUT_TICK_SECONDS")),
        "options": {"expires": env("ROLLOUT_TICK_SECONDS") * 2},
    },
    "jobs-slurm-sync": {
        "task": "jobs.slurm_sync",
        "schedule": timedelta(seconds=env("SLURM_SYNC_SECONDS")),
        "options": {"expires": env("SLURM_SYNC_SECONDS") * 2},
    },
    "telemetry-risk-sweep": {
        "task": "telemetry.risk_sweep",
        "schedule": timedelta(seconds=env("RISK_SWEEP_SECONDS")),
        "options": {"expires": env("RISK_SWEEP_SECONDS")},
    },
    "telemetry-notifications": {
        "task": "telemetry.notifications",
        "schedule": timedelta(seconds=5),
        "options": {"expires": 10},
    },
    "simulator-scenarios": {
        "task": "simulator.scenarios",
        "schedule": timedelta(seconds=2),
        "options": {"expires": 4},
    },
    "simulator-whatif-sweep": {
        "task": "simulator.whatif_sweep",
        "schedule": timedelta(seconds=30),
        "options": {"expires": 60},
    },
    "telemetry-retention-prune": {
        "task": "telemetry.retention_prune",
        "schedule": timedelta(seconds=env("RETENTION_PRUNE_SECONDS")),
        "options": {"expires": min(1800, env("RETENTION_PRUNE_SECONDS"))},
    },
    "retention-prune": {
        "task": "controlplane.retention_prune",
        "schedule": timedelta(seconds=env("RETENTION_PRUNE_SECONDS")),
        "options": {"expires": min(600, env("RETENTION_PRUNE_SECONDS"))},
    },
}

# Redis pub/sub channels ignore the database number, so the prefix carries it: two Lockstep installations
# (or test runs) on one Redis server, in different databases, never hear each other's events.
_redis_db = (urlparse(REDIS_URL).path.strip("/") or "0").split("/")[0]
CHANNEL_LAYERS = {
    "default": {
        # The pub/sub layer resubscribes its groups when Redis comes back; events it drops while Redis is away
        # are still in the outbox and are re-sent by the sweep or fetched by the client on reconnect.
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL], "prefix": f"lockstep{_redis_db}"},
    }
}

EVENT_RETENTION_DAYS = env("EVENT_RETENTION_DAYS")
AUDIT_RETENTION_DAYS = env("AUDIT_RETENTION_DAYS")
OUTBOX_RELAY_TIMEOUT = env("OUTBOX_RELAY_TIMEOUT")
# whether publishing relays its events after commit; off only where no one can listen (the what-if's scratch process)
OUTBOX_RELAY = True
READYZ_TIMEOUT = env("READYZ_TIMEOUT")
HEARTBEAT_SECONDS = env("HEARTBEAT_SECONDS")
TOKEN_LAST_USED_RESOLUTION = env("TOKEN_LAST_USED_RESOLUTION")
TELEMETRY_MAX_BATCH_BYTES = env("TELEMETRY_MAX_BATCH_BYTES")
TELEMETRY_MAX_SKEW_SECONDS = env("TELEMETRY_MAX_SKEW_SECONDS")
TELEMETRY_RAW_RETENTION_HOURS = env("TELEMETRY_RAW_RETENTION_HOURS")
TELEMETRY_HISTORY_DAYS = env("TELEMETRY_HISTORY_DAYS")
TELEMETRY_THERMAL_CELSIUS = env("TELEMETRY_THERMAL_CELSIUS")
TELEMETRY_SYMBOL_ERRORS_PER_HOUR = env("TELEMETRY_SYMBOL_ERRORS_PER_HOUR")
RISK_SWEEP_SECONDS = env("RISK_SWEEP_SECONDS")
PREDICTION_HORIZON_HOURS = env("PREDICTION_HORIZON_HOURS")
SIMULATOR_ACCELERATION = env("SIMULATOR_ACCELERATION")
SIMULATOR_SHOWCASE_SECONDS = env("SIMULATOR_SHOWCASE_SECONDS")
DEMO_ADMIN_USERNAME = env("DEMO_ADMIN_USERNAME")
DRIFT_SWEEP_SECONDS = env("DRIFT_SWEEP_SECONDS")
DRIFT_MAX_CORRECTIONS = env("DRIFT_MAX_CORRECTIONS")
ROLLOUT_TICK_SECONDS = env("ROLLOUT_TICK_SECONDS")

# --- Fault tolerance (jobs) ----------------------------------------------------------------------------
# The public data every process reads, inside the repository (data/README.md; checked at start-up by
# controlplane.data.check).
DATA_DIR = BASE_DIR / "data"
XID_CATALOG = env("XID_CATALOG")
FAULT_CORRELATION_SECONDS = env("FAULT_CORRELATION_SECONDS")
FAULT_SWEEP_SECONDS = env("FAULT_SWEEP_SECONDS")
ESCALATION_STRIKES = env("ESCALATION_STRIKES")
ESCALATION_WINDOW_SECONDS = env("ESCALATION_WINDOW_SECONDS")
NODE_COOLDOWN_SECONDS = env("NODE_COOLDOWN_SECONDS")
NIC_REPAIR_SECONDS = env("NIC_REPAIR_SECONDS")
LINK_DEGRADED_SECONDS = env("LINK_DEGRADED_SECONDS")
LINK_CLEAN_SECONDS = env("LINK_CLEAN_SECONDS")
AGENT_INTERVAL_SECONDS = env("AGENT_INTERVAL_SECONDS")
SILENCE_INTERVALS = env("SILENCE_INTERVALS")
HANG_STEP_MULTIPLE = env("HANG_STEP_MULTIPLE")
HANG_FLOOR_SECONDS = env("HANG_FLOOR_SECONDS")
RECOVERY_ESTIMATE_MIN_SAMPLES = env("RECOVERY_ESTIMATE_MIN_SAMPLES")
RESTART_BASELINE_MIN_SAMPLES = env("RESTART_BASELINE_MIN_SAMPLES")
RANK_REPLACEMENT_DEADLINE_SECONDS = env("RANK_REPLACEMENT_DEADLINE_SECONDS")
ESCALATION_CLEAN_TELEMETRY_SECONDS = env("ESCALATION_CLEAN_TELEMETRY_SECONDS")
ROLLOUT_GATE_SIGNIFICANCE = env("ROLLOUT_GATE_SIGNIFICANCE")
ROLLOUT_GATE_BASELINE_HOURS = env("ROLLOUT_GATE_BASELINE_HOURS")
RECOVERY_DEADLINE_FACTOR = env("RECOVERY_DEADLINE_FACTOR")
RECOVERY_DEADLINE_EXTRA_SECONDS = env("RECOVERY_DEADLINE_EXTRA_SECONDS")
RECOVERY_RESTART_RETRIES = env("RECOVERY_RESTART_RETRIES")
RECOVERY_RETRY_BACKOFF_SECONDS = env("RECOVERY_RETRY_BACKOFF_SECONDS")
RECOVERY_SPARE_WAIT_SECONDS = env("RECOVERY_SPARE_WAIT_SECONDS")
RECOVERY_SPARE_POLL_SECONDS = env("RECOVERY_SPARE_POLL_SECONDS")
DRAIN_DEADLINE_SECONDS = env("DRAIN_DEADLINE_SECONDS")
PROACTIVE_PRECISION_PRIOR = env("PROACTIVE_PRECISION_PRIOR")
PROACTIVE_PRECISION_MIN_JUDGED = env("PROACTIVE_PRECISION_MIN_JUDGED")

# --- REST API -------------------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "tenancy.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "tenancy.permissions.TokenScope",
    ],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "controlplane.pagination.Pagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "controlplane.openapi.AutoSchema",  # documents error answers as well as success
    "EXCEPTION_HANDLER": "controlplane.api.exception_handler",
    # An unknown ?format= is a 400 naming the formats, not DRF's 404 (controlplane/negotiation.py).
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "controlplane.negotiation.ContentNegotiation",
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    # JSON with a nesting bound (controlplane/parsers.py): a deeply nested body is a 400, not a RecursionError.
    "DEFAULT_PARSER_CLASSES": [
        "controlplane.parsers.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Lockstep API",
    "DESCRIPTION": "Control plane for GPU cluster fleets: blueprints, rollouts, drift, faults, recovery and GPU-hours saved.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # No deep links: Swagger UI puts each operation's link inside the button that opens it (a control nested in a
    # control, which screen readers cannot reach; axe's nested-interactive).
    "SWAGGER_UI_SETTINGS": {"deepLinking": False},
    "COMPONENT_SPLIT_REQUEST": True,
    # One tag per area (app), so Swagger UI groups operations as the folders do (controlplane/openapi.py).
    "TAGS": OPENAPI_TAGS,
    # OpenAPI links from a create's answer to its object's operations (controlplane/openapi_links.py).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "controlplane.openapi_links.add_links",
    ],
    # Several models have a "kind" or "state" choice: name each enum after what it is.
    "ENUM_NAME_OVERRIDES": {
        "FaultKindEnum": "jobs.choices.FaultKind",
        # Choice sets an incident's detail shares with the fault and action components (the names they had).
        "FaultStateEnum": "jobs.choices.FaultState",
        "RecoveryActionKindEnum": "jobs.choices.ActionKind",
        "RecoveryActionStateEnum": "jobs.choices.ActionState",
        "IncidentStateEnum": "jobs.choices.IncidentState",
        "IncidentScopeEnum": "jobs.choices.IncidentScope",
        "ScopeEnum": "tenancy.choices.TokenScope",
        "RolloutStateEnum": "fleet.choices.RolloutState",
        "BlueprintVersionStateEnum": "fleet.choices.VersionState",
        "AutomationEnum": "fleet.choices.AutomationMode",  # a fleet's, a cluster's and the provider switch's mode
    },
}

# How controlplane reaches the token check without importing tenancy (dependencies point one way).
LOCKSTEP_TOKEN_AUTHENTICATOR = "tenancy.authentication.user_for_bearer"

# --- security (docs/security.md) ------------------------------------------------------------------------
# Production (DEBUG off) speaks HTTPS only: redirect, HSTS, Secure cookies. PLAIN_HTTP lifts that for a local
# compose run and the test suite, which serve http://127.0.0.1; `manage.py check --deploy` is clean without it.
PLAIN_HTTP = DEBUG or env("PLAIN_HTTP")
SECURE_SSL_REDIRECT = env("SECURE_SSL_REDIRECT") and not PLAIN_HTTP
# Probes and scrapers reach the web process directly over plain HTTP, inside the deployment.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SECURE_HSTS_SECONDS = 0 if PLAIN_HTTP else env("SECURE_HSTS_SECONDS")
SECURE_HSTS_INCLUDE_SUBDOMAINS = env("SECURE_HSTS_INCLUDE_SUBDOMAINS")
SECURE_HSTS_PRELOAD = env("SECURE_HSTS_PRELOAD")
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if env("TRUST_X_FORWARDED_PROTO") else None
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
SESSION_COOKIE_SECURE = not PLAIN_HTTP
CSRF_COOKIE_SECURE = not PLAIN_HTTP
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
X_FRAME_OPTIONS = "DENY"
DATA_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024 * 1024

# Content security policy (django-csp): scripts and styles from Lockstep's own origin only, no inline script,
# no inline style. controlplane.security_csp adds the websocket's ws(s)://<host> and the hashes of the <style>
# elements plotly.js writes at run time (docs/security.md).
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}

# Rate limits on the login form and on token issue (controlplane/security_ratelimit.py), counted in Redis.
LOGIN_RATE = env("LOGIN_RATE")
# The proxies uvicorn was told to believe; the address rate limits key on is checked against them (security_ratelimit).
FORWARDED_ALLOW_IPS = [
    address.strip() for address in env("FORWARDED_ALLOW_IPS").split(",") if address.strip()
]
LOGIN_ADDRESS_RATE = env("LOGIN_ADDRESS_RATE")
TOKEN_CREATE_RATE = env("TOKEN_CREATE_RATE")
# Django's RedisCache increments atomically (INCRBY, SET NX), which is what django-ratelimit needs; its list of
# supported backends predates Django's own Redis cache, hence its W001.
SILENCED_SYSTEM_CHECKS = ["django_ratelimit.W001"]
CACHES = {
    "default": {
        "BACKEND": "controlplane.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "lockstep",
        "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1},
    }
}

# Cluster credentials are encrypted at rest with these Fernet keys (controlplane/security_crypto.py).
CREDENTIALS_KEYS = env("CREDENTIALS_KEYS")

LOG_ROUTINE_TASKS = env("LOG_ROUTINE_TASKS")

# Every log record passes through the redaction of secrets (controlplane/security_logging.py).
LOGGING_CONFIG = "controlplane.security_logging.configure"
# Beat's routine tasks log at DEBUG and a refused request on one line (controlplane/logging_filters.py). Django's
# own "django" logger gets no handler of its own (its default prints to the console with DEBUG on, and the
# record then reached the root's console as well: each 403 was logged twice) and the root's level.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "redact_secrets": {"()": "controlplane.security_logging.RedactSecretsFilter"},
        "routine_tasks_at_debug": {"()": "controlplane.logging_filters.RoutineTasksAtDebug"},
        "client_errors_on_one_line": {"()": "controlplane.logging_filters.ClientErrorsOnOneLine"},
    },
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["client_errors_on_one_line", "redact_secrets"],
        }
    },
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL")},
    "loggers": {
        "django": {"handlers": [], "level": "NOTSET", "propagate": True},
        "django.db.backends": {"level": "INFO"},
        **{
            name: {"filters": ["routine_tasks_at_debug"]}
            for name in ("celery.beat", "celery.worker.strategy", "celery.worker.request", "celery.app.trace")
        },
    },
}
