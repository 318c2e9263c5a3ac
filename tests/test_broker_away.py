"""With the broker away, a change that was stored answers as stored: the work it queues after COMMIT is logged as
not queued (a beat sweep picks it up), not raised as a 500 that makes the client retry what was stored."""

import pytest
import requests

from controlplane.access import Role
from fleet.models import Cluster, Rollout
from fleet.services.blueprints import version_create
from simulator.models import WhatIfRun
from tests.support.blueprints import ADDONS, blueprint, bump, clusters_on
from tests.support.factories import make_fleet, make_user, token_header
from tests.support.processes import free_port, uvicorn_server

pytestmark = pytest.mark.django_db(transaction=True)


def test_stored_changes_answer_as_stored_while_the_broker_is_away(tmp_path):
    operator = make_user(Role.OPERATOR)
    bp, v1 = blueprint(operator, name="broker-away", auto_rollout=False)
    version_create(actor=operator, blueprint=bp, addons=bump(ADDONS, "gpu-operator", "24.9.1"), activate=True)
    assigned, rolled = clusters_on(v1, 2, fleet=make_fleet("broker-away"), track_latest=False)
    auth = {"Authorization": token_header(operator, "write")["HTTP_AUTHORIZATION"]}
    nothing_listens = f"redis://127.0.0.1:{free_port()}/0"  # broker, channel layer: away

    with uvicorn_server(tmp_path, REDIS_URL=nothing_listens) as web:
        answers = {
            "assign": requests.put(
                f"{web.url}/api/v1/clusters/{assigned.pk}/blueprint/",
                headers=auth,
                timeout=30,
                json={"blueprint": bp.pk, "version": 2, "reason": "broker away"},
            ),
            "rollout": requests.post(
                f"{web.url}/api/v1/rollouts/",
                headers=auth,
                timeout=30,
                json={"blueprint": bp.pk, "version": 2, "targets": {"clusters": [rolled.pk]}},
            ),
            "whatif": requests.post(
                f"{web.url}/api/v1/whatif/",
                headers=auth,
                timeout=30,
                json={"seed": 2, "gpus": 2048, "days": 10},
            ),
        }
        log = web.output()

    assert {name: answer.status_code for name, answer in answers.items()} == {
        "assign": 200,
        "rollout": 201,
        "whatif": 202,
    }, {name: answer.text[:300] for name, answer in answers.items()}
    assert Cluster.objects.get(pk=assigned.pk).blueprint_version.number == 2
    assert Rollout.objects.filter(pk=answers["rollout"].json()["id"]).exists()
    assert WhatIfRun.objects.get(pk=answers["whatif"].json()["id"]).state == WhatIfRun.State.QUEUED
    for task in ("fleet.cluster_reconcile", "fleet.rollout_progress", "simulator.whatif"):
        assert f"could not queue {task}" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
