"""The agent's second line: a start command the platform sent but this node's operator does
not allow (a host path outside the node's own allow-list) is refused by the agent, reported
as a permanent InvalidConfig failure, and nothing runs."""

from __future__ import annotations

import pytest

from .cluster import Cluster

pytestmark = pytest.mark.integration


def test_the_agent_refuses_a_volume_outside_its_own_allow_list(cluster: Cluster) -> None:
    # The gateway allows /data/<tenant> (its default list); this node only /tmp/heteroflow.
    cluster.start_agent("n1", HETEROFLOW_VOLUME_ALLOW_LIST='["/tmp/heteroflow"]')
    volume = {"host_path": "/data/default/secrets", "container_path": "/work"}
    t = cluster.create(command="echo ran > /dev/null; echo ran", volumes=[volume])
    done = cluster.wait_status(t["id"], "failed", "completed")
    assert done["status"] == "failed", done
    assert "refused by the node" in done["error"] and "/data/default/secrets" in done["error"]
    assert done["retry_count"] == 0  # InvalidConfig is permanent: never retried
    assert "running" not in cluster.statuses(t["id"])
