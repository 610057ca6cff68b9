"""One list of services (heteroflow/services.py), and nothing else that lists them.

That every package under services/ is in `SERVICES` and that nothing else lists services is
checked with the rest of the code's shape (tests/unit/test_architecture.py). Here: the
deployment manifests run exactly the services of the list; the NATS permissions built
from the specs are the ones the platform promises (docs/security.md).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from heteroflow.services import SERVICES, by_name, lease_ttl_s, names, nats_users
from libs.bus import permissions as perms

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = ROOT / "heteroflow" / "services.py"
# The platform's code. (bench/ builds control planes of its own and names their connections.)
SCANNED = ("libs", "services", "agent", "heteroflow", "deploy")


def _compose_services() -> set[str]:
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    return {
        svc["command"][1]
        for svc in compose["services"].values()
        if isinstance(svc.get("command"), list) and svc["command"][:1] == ["service"]
    }


def _kubernetes_services() -> set[str]:
    found: set[str] = set()
    for path in sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "Deployment":
                continue
            containers: list[dict[str, Any]] = doc["spec"]["template"]["spec"]["containers"]
            found |= {c["args"][1] for c in containers if c.get("args", [])[:1] == ["service"]}
    return found


@pytest.mark.parametrize(
    "manifest", [_compose_services, _kubernetes_services], ids=["compose", "k8s"]
)
def test_the_manifests_run_exactly_the_services(manifest: Any) -> None:
    assert manifest() == set(names())


@pytest.mark.parametrize(
    ("subject", "publishers"),
    [
        (perms.NODE_COMMANDS, {"scheduler"}),
        (perms.EVENTS, {"outbox-relay"}),
        (perms.SERVING_METRICS, {"api-gateway"}),
    ],
    ids=["node-commands", "domain-events", "router-figures"],
)
def test_only_its_service_publishes_a_restricted_subject(
    subject: str, publishers: set[str]
) -> None:
    allowed = {
        user.name
        for user in nats_users()
        if subject not in perms.service_permissions(user)["publish"]["deny"]
    }
    assert allowed == publishers


def test_no_service_publishes_as_a_node_or_administers_streams() -> None:
    for user in nats_users():
        deny = perms.service_permissions(user)["publish"]["deny"]
        assert {*perms.STREAM_ADMIN, *perms.NODE_OWN_SUBJECTS} <= set(deny), user.name


def test_a_user_may_name_only_restricted_subjects() -> None:
    with pytest.raises(ValueError, match="not a restricted subject"):
        perms.NatsUser("x", may_publish=("hf.node.*.report",))


def test_the_leading_services_share_the_lease_bucket_ttl() -> None:
    leaders = {spec.name for spec in SERVICES if spec.lease_ttl_s is not None}
    assert leaders == {"scheduler", "autoscaler", "rollout"}
    assert lease_ttl_s() > 0


def test_readiness_waits_for_the_durables_the_routes_declare() -> None:
    consumers = {spec.name: spec.consumers() for spec in SERVICES}
    assert consumers["scheduler"] == ("scheduler-dispatch", "scheduler-reports")
    assert consumers["retry-engine"] == ("retry-engine",)
    assert consumers["api-gateway"] == ()


@pytest.mark.parametrize(
    "code",
    [
        "import services.scheduler.placement",
        "import services.retry_engine.decide",
        "from heteroflow.cli import build_parser; build_parser()",
    ],
    ids=["placement", "retry-decide", "cli-parser"],
)
def test_a_pure_import_loads_no_service(code: str) -> None:
    """`SERVICE` is built on first use: a pure module of a service package, or the CLI's
    parser, does not import the service modules (nor their I/O libraries)."""
    check = (
        f"{code}\nimport sys\n"
        "loaded = [m for m in sys.modules if m.endswith('.service') and m.startswith('services')]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", check], cwd=ROOT, check=True, timeout=60)


def test_a_services_up_flag_is_a_switch_of_up() -> None:
    from heteroflow.platform import PlatformSettings

    flags = {spec.name: spec.up_flag for spec in SERVICES if spec.up_flag is not None}
    assert flags == {"rollout": "rollout_in_up"}
    for flag in flags.values():
        assert PlatformSettings.model_fields[flag].annotation is bool


def test_up_hands_the_gateway_its_own_settings_and_the_others_theirs() -> None:
    from heteroflow.platform import PlatformSettings, service_settings

    platform = PlatformSettings(port=4444)
    assert service_settings(by_name("api-gateway"), platform) is platform
    scheduler = by_name("scheduler")
    assert type(service_settings(scheduler, platform)) is scheduler.Settings
