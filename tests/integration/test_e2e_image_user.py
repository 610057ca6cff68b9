"""Users' images as they are: a serving group whose command writes under `/` runs as the
image's user (busybox: root, with the kept capabilities) and serves through the router; on a
node whose operator forces a uid, that uid applies and the node reports how it is configured.
"""

from __future__ import annotations

import docker
import pytest

from .cluster import Cluster
from .conftest import requires_docker
from .test_e2e_serving import call, create_group, ready_replicas

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.docker, requires_docker]

# The command of issue 26, verbatim: it fails at its first step as uid 65534.
WRITES_UNDER_ROOT = "mkdir -p /www && echo ok > /www/health && httpd -f -p 8080 -h /www"
# Where / is not writable: what the container runs as, served from /tmp.
SERVES_ITS_UID = (
    "mkdir -p /tmp/www && echo ok > /tmp/www/health && id -u > /tmp/www/uid && "
    "exec httpd -f -p 8080 -h /tmp/www"
)
SERVING = {"port": 8080, "health_path": "/health"}


def test_an_image_that_writes_under_root_serves_as_its_own_user(cluster: Cluster) -> None:
    cluster.start_agent("iu1", "docker")
    (node,) = [n for n in cluster.nodes() if n["id"] == "iu1"]
    options = docker.from_env().info().get("SecurityOptions") or []
    assert node["inventory"]["userns_remap"] is any("name=userns" in o for o in options)
    g = create_group(cluster, task_count=1, command=WRITES_UNDER_ROOT, serving=SERVING)
    cluster.wait(lambda: len(ready_replicas(cluster, g["id"])) == 1, "a ready replica", 60)
    r = call(cluster, g["id"], "health")
    assert r.status_code == 200 and r.text.strip() == "ok", r.text


def test_a_forced_uid_applies_where_the_operator_configures_one(cluster: Cluster) -> None:
    cluster.start_agent("iu2", "docker", HETEROFLOW_CONTAINER_USER="65534:65534")
    g = create_group(cluster, task_count=1, command=SERVES_ITS_UID, serving=SERVING)
    cluster.wait(lambda: len(ready_replicas(cluster, g["id"])) == 1, "a ready replica", 60)
    r = call(cluster, g["id"], "uid")
    assert r.status_code == 200 and r.text.strip() == "65534", r.text
