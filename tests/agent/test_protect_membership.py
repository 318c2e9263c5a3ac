"""The membership of an in-place job (lockstep_agent/protect/membership.py): only a standby that proves it is the
job's is given a lost rank's place. In one process, over a real TCPStore; the Slurm tests run the whole of it."""

import socket

import pytest


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_only_a_standby_proven_with_the_jobs_key_counts_as_one():
    pytest.importorskip("torch", reason="the protection runtime needs torch")
    from lockstep_agent.protect import keys
    from lockstep_agent.protect.membership import Membership

    job_key = keys.derive(keys.root(b"s" * 40), "job-1").beat
    other_key = keys.derive(keys.root(b"o" * 40), "job-1").beat
    where = {"active": 1, "job": "job-1", "host": "127.0.0.1", "port": _free_port(), "beat_every": 0.05}
    leader = Membership(member=0, node="n1", key=job_key, **where)
    leader.announce_total(4)
    members = [
        Membership(member=1, node="n2", key=job_key, **where),  # the job's
        Membership(member=2, node="n3", key=None, **where),  # reached the store, knows no key
        Membership(member=3, node="n4", key=other_key, **where),  # another job's key
    ]
    try:
        assert leader._live_standbys(leader.store) == [1]
        # Member 2 copies the proven standby's record: its own heartbeats still carry no tag of the job's key.
        leader.store.set("member/2", leader.store.get("member/1"))
        assert leader._live_standbys(leader.store) == [1]
        # A late standby takes the next member number and, proven, counts too.
        late = Membership(member=-1, node="n5", key=job_key, **where)
        members.append(late)
        assert late.member == 4 and leader._live_standbys(leader.store) == [1, 4]
    finally:
        for member in [*members, leader]:
            member.close()
