"""Process configuration: one pydantic-settings class per process, prefix `HETEROFLOW_`.

Shared fields live in `CommonSettings`; each service subclasses it with what it alone needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from libs.collector import SERVICE_DEFAULT
from libs.domain.task.model import RetryStrategy, allow_list_entry_error


def _allow_list(entries: list[str]) -> list[str]:
    bad = [why for e in entries if (why := allow_list_entry_error(e))]
    if bad:
        raise ValueError("; ".join(bad))
    return entries


#: Volume host_path prefixes: `/prefix` (every tenant), `/prefix/{tenant}` (each tenant's
#: own directory), `<tenant>=/prefix` (that tenant only). See docs/configuration.md.
VolumeAllowList = Annotated[list[str], AfterValidator(_allow_list)]
DEFAULT_VOLUME_ALLOW_LIST = ("/data/{tenant}", "/mnt/datasets/{tenant}", "/tmp/heteroflow/{tenant}")


def default_home() -> Path:
    return Path.home() / ".heteroflow"


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HETEROFLOW_", extra="ignore")

    home: Path = Field(default_factory=default_home, description="state directory")
    nats_url: SecretStr | None = Field(
        default=None,
        description="external NATS, several servers comma-separated; unset = embedded",
    )
    nats_replicas: int = Field(
        default=1,
        ge=1,
        le=5,
        description="replicas of every stream and the lease bucket: 3 on a three-server "
        "JetStream cluster, 1 on the embedded single server",
    )
    database_url: SecretStr | None = Field(
        default=None, description="external PostgreSQL; unset = embedded"
    )
    log_level: str = "info"
    log_format: str = Field(default="auto", description="json | console | auto (console on a TTY)")
    metrics_port: int = Field(default=0, description="Prometheus port of a lone service; 0 = off")
    metrics_host: str = Field(
        default="127.0.0.1",
        description="address the probe port (/healthz, /readyz, /metrics) binds; 0.0.0.0 in a "
        "container or pod, so the orchestrator's probes reach it",
    )
    gc_threshold: int = Field(
        default=SERVICE_DEFAULT,
        ge=0,
        description="allocations between two young-generation collections of Python's cyclic "
        "collector in a long-running process; 0 = Python's own (700)",
    )


class GatewaySettings(CommonSettings):
    host: str = "127.0.0.1"
    port: int = 3333
    jwt_secret: SecretStr | None = Field(default=None, description="HS256 secret for tenant JWTs")
    jwt_issuer: str = "heteroflow"
    volume_allow_list: VolumeAllowList = Field(
        default_factory=lambda: list(DEFAULT_VOLUME_ALLOW_LIST),
        description="host_path prefixes a task volume may use: /prefix, /prefix/{tenant}, "
        "<tenant>=/prefix",
    )
    # Seed 003's `scheduler.retry.max_retries` / `default_strategy`: written into a task that
    # leaves the field out when it is created (its own value overrides them).
    retry_max_retries: int = Field(
        default=3, ge=0, le=100, description="max_retries of a task that names none"
    )
    retry_default_strategy: RetryStrategy = Field(
        default=RetryStrategy.RETRY_NEW_NODE,
        description="retry_strategy of a task that names none",
    )
    db_pool_max: int = 10
    db_wait_timeout_s: float = Field(
        default=2.0,
        gt=0,
        description="longest a request waits for a database connection; then 503 + Retry-After",
    )
    max_inflight_writes: int = Field(
        default=64,
        ge=0,
        description="creates/updates/deletes in flight per gateway process; beyond: 503 at "
        "once (0 = unbounded)",
    )
    max_inflight_writes_per_tenant: int = Field(
        default=0,
        ge=0,
        description="writes one tenant may have in flight per gateway process; beyond: 503 "
        "while the other tenants still find room (0 = three quarters of max_inflight_writes; no "
        "share under 4)",
    )
    max_inflight_reads: int = Field(
        default=256,
        ge=0,
        description="reads in flight per gateway process (until the first byte of the answer); "
        "beyond: 503 at once (0 = unbounded)",
    )
    tenant_write_rate_per_s: float = Field(
        default=100.0,
        ge=0,
        description="sustained writes per second per tenant and gateway process; beyond: 429 "
        "(0 = unlimited)",
    )
    tenant_write_burst: int = Field(
        default=200, ge=1, description="writes a tenant may send at once above its rate"
    )
    max_body_bytes: int = Field(
        default=1024 * 1024, gt=0, description="largest request body accepted; larger: 413"
    )
    max_json_depth: int = Field(
        default=32, ge=2, le=256, description="deepest JSON nesting accepted in a body; deeper: 400"
    )
    client_header_timeout_s: float = Field(
        default=10.0,
        ge=0,
        description="longest a client may take to send a request's headers; then 408 and the "
        "connection closed (0 = no limit)",
    )
    client_body_timeout_s: float = Field(
        default=30.0,
        ge=0,
        description="longest a client may take to send a request's body once its headers are "
        "in; then 408 and the connection closed (0 = no limit)",
    )
    max_client_connections: int = Field(
        default=0,
        ge=0,
        description="open client connections per gateway process; a new one past it closes "
        "the one idle longest (0 = the open-files limit less a quarter, at least 128 less)",
    )
    gateway_workers: int = Field(
        default=1, ge=1, le=64, description="gateway processes sharing the port (1: in-process)"
    )
    auth_cache_ttl_s: float = Field(
        default=5.0,
        ge=0,
        description="seconds a key or tenant lookup is reused; a revoked key works this long",
    )
    carbon_intensity_g_per_kwh: float = Field(
        default=475.0, ge=0, description="grid carbon factor for energy estimates"
    )
    # libs/diskspace.py: writes are shed below the smaller of the two.
    disk_min_free_mb: float = Field(
        default=500.0,
        ge=0,
        description="free space under HETEROFLOW_HOME below which writes get 503 (and the "
        "smaller of this and disk_min_free_percent counts; 0 = never)",
    )
    disk_min_free_percent: float = Field(
        default=5.0,
        ge=0,
        le=100,
        description="the same as a share of the file system's size (0 = never)",
    )
    serve_max_body_bytes: int = Field(
        default=16 * 1024 * 1024, gt=0, description="largest request body /serve/ proxies; 413"
    )
    serve_wait_s: float = Field(
        default=30.0, gt=0, description="how long /serve/ holds a request for a ready replica"
    )
    serve_queue_max: int = Field(
        default=100, ge=0, description="requests held per target while none is ready; 503 past"
    )
    serve_probe_interval_s: float = Field(
        default=1.0, gt=0, description="how often the router re-reads replicas and probes health"
    )
    serve_upstream_timeout_s: float = Field(
        default=300.0, gt=0, description="read timeout of a proxied request"
    )
    serve_first_byte_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="how long a replica may take to start its answer once it has the request; 504",
    )
    serve_window_s: float = Field(
        default=60.0, gt=0, description="sliding window of the router's requests/s and p95"
    )
    serve_metrics_interval_s: float = Field(
        default=5.0, gt=0, description="how often the router exports and publishes its figures"
    )
    serve_adopt_interval_s: float = Field(
        default=30.0, gt=0, description="how often the router looks for serving targets to watch"
    )
    serve_dataplane: bool = Field(
        default=True,
        description="proxy /serve/ on the gateway's own HTTP protocol with pooled upstream "
        "connections (false: through the API application and httpx)",
    )
    serve_max_outstanding: int = Field(
        default=1024,
        ge=0,
        description="requests in flight per target and gateway worker; 503 + Retry-After past "
        "it (0 = no cap)",
    )

    def task_defaults(self) -> dict[str, object]:
        """Configured values of the task fields whose default is configuration."""
        return {
            "max_retries": self.retry_max_retries,
            "retry_strategy": self.retry_default_strategy.value,
        }
