"""A lone process's /readyz: 503 naming what is missing until its conditions hold and its
consumers pull; a consumer that stops makes it unready again."""

from __future__ import annotations

import httpx

from heteroflow.probe import probe_app, readiness
from libs.health import Readiness


def test_unmet_names_failing_checks_and_missing_consumers() -> None:
    r = Readiness()
    connected = False
    r.require("nats connected", lambda: connected)
    r.require("broken check", lambda: 1 / 0 == 0)
    assert r.unmet(["dispatch"]) == [
        "broken check",
        "nats connected",
        "consumer dispatch not started",
    ]
    connected = True
    r.require("broken check", lambda: True)  # re-registered after a restart
    r.consumer_started("dispatch")
    assert r.unmet(["dispatch"]) == []
    r.consumer_stopped("dispatch")
    assert r.unmet(["dispatch"]) == ["consumer dispatch not started"]


async def test_probe_answers_503_then_200_and_serves_metrics() -> None:
    from libs.health import READINESS

    READINESS.clear()
    app = probe_app(readiness(["probe-test-consumer"]))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://probe") as client:
        r = await client.get("/readyz")
        assert r.status_code == 503
        assert r.json()["missing"] == ["consumer probe-test-consumer not started"]
        READINESS.consumer_started("probe-test-consumer")
        try:
            assert (await client.get("/readyz")).json() == {"status": "ok"}
        finally:
            READINESS.clear()
        assert (await client.get("/healthz")).status_code == 200
        assert "python_info" in (await client.get("/metrics")).text  # the process registry
