"""The Kubernetes manifests in deploy/kubernetes/, checked offline against the Kubernetes
JSON schemas (`kubernetes-validate`, strict: an unknown field is an error), and for what the
deployment promises: probes and resource requests on every container, a disruption budget for
the gateway, a three-server NATS StatefulSet with JetStream on persistent volumes."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

MANIFESTS = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
# The oldest Kubernetes the manifests claim to run on (policy/v1 PodDisruptionBudget: 1.21+).
K8S_VERSION = "1.27"


def documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in documents() if d["kind"] == kind}


def validate(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("doc", documents(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_manifest_passes_the_kubernetes_schema(doc: dict[str, Any]) -> None:
    validate(doc)


def _gateway() -> dict[str, Any]:
    return copy.deepcopy(by_kind("Deployment")["heteroflow-api-gateway"])


def _no_replicas_type(d: dict[str, Any]) -> None:
    d["spec"]["replicas"] = "two"


def _unknown_field(d: dict[str, Any]) -> None:
    d["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}


def _no_image_list(d: dict[str, Any]) -> None:
    d["spec"]["template"]["spec"]["containers"] = {"name": "api-gateway"}


@pytest.mark.parametrize(
    "breaks",
    [_no_replicas_type, _unknown_field, _no_image_list],
    ids=["replicas-not-an-integer", "misspelt-field", "containers-not-a-list"],
)
def test_an_invalid_manifest_is_refused(breaks: Any) -> None:
    doc = _gateway()
    breaks(doc)
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(doc)


def _workloads() -> list[dict[str, Any]]:
    kinds = ("Deployment", "StatefulSet", "DaemonSet")
    return [d for d in documents() if d["kind"] in kinds]


@pytest.mark.parametrize("doc", _workloads(), ids=lambda d: d["metadata"]["name"])
def test_every_container_is_probed_and_requests_resources(doc: dict[str, Any]) -> None:
    for container in doc["spec"]["template"]["spec"]["containers"]:
        assert container["readinessProbe"]["httpGet"]["path"].startswith(("/readyz", "/healthz"))
        assert "livenessProbe" in container
        assert {"cpu", "memory"} <= set(container["resources"]["requests"])


def test_one_deployment_per_service() -> None:
    from heteroflow.services import names

    deployments = by_kind("Deployment")
    for name in names():
        args = deployments[f"heteroflow-{name}"]["spec"]["template"]["spec"]["containers"][0]
        assert args["args"] == ["service", name]
    assert deployments["heteroflow-api-gateway"]["spec"]["replicas"] >= 2
    assert deployments["heteroflow-scheduler"]["spec"]["replicas"] == 2


def test_the_gateway_has_a_disruption_budget() -> None:
    pdb = by_kind("PodDisruptionBudget")["heteroflow-api-gateway"]
    labels = _gateway()["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] == 1


def test_nats_is_three_jetstream_servers_on_persistent_volumes() -> None:
    nats = by_kind("StatefulSet")["nats"]
    assert nats["spec"]["replicas"] == 3
    claims = {c["metadata"]["name"] for c in nats["spec"]["volumeClaimTemplates"]}
    mounts = nats["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "jetstream", "mountPath": "/data"} in mounts and "jetstream" in claims
    conf = by_kind("ConfigMap")["nats"]["data"]["nats.conf"]
    assert "store_dir: /data" in conf and conf.count("nats-route://") == 3
    assert by_kind("ConfigMap")["heteroflow"]["data"]["HETEROFLOW_NATS_REPLICAS"] == "3"


def test_postgresql_is_external_through_a_secret() -> None:
    secret = by_kind("Secret")["heteroflow-postgres"]
    assert secret["stringData"]["HETEROFLOW_DATABASE_URL"].startswith("postgresql://")
    assert "StatefulSet" not in {d["kind"] for d in documents() if "postgres" in str(d["metadata"])}
