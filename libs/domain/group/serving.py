"""Inference serving, the pure parts: the `serving` declaration, the task_type heuristic, the
router's choice of replica and its sliding-window request figures.

No I/O and no clock of its own: the router (services/api_gateway/router.py) passes `now`.
"""

from __future__ import annotations

import math
import random
import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from libs.domain.validation import exactly_int

# Whole words in the image's repository path that name an inference server. The registry host
# and the tag are not looked at (`myapp:vllm-fix` is not vLLM).
INFERENCE_IMAGE_WORDS: tuple[str, ...] = (
    "vllm",
    "sglang",
    "tgi",
    "text-generation-inference",
    "triton",
    "tritonserver",
    "llama.cpp",
    "llama-cpp",
    "llama_cpp",
    "llamacpp",
    "mindie",
    "lmdeploy",
    "ollama",
    "trtllm",
    "tensorrt-llm",
)
_WORDS = re.compile(
    r"(?<![a-z0-9])(?:" + "|".join(re.escape(w) for w in INFERENCE_IMAGE_WORDS) + r")(?![a-z0-9])"
)
_PATH = re.compile(r"^/[A-Za-z0-9._~!$&'()*+,;=:@/%-]*$")


class ServingSpec(BaseModel):
    """`serving: {port, health_path, metrics_path?}` of an inference task or group."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    port: int = Field(ge=1, le=65535)
    health_path: str = Field(default="/", max_length=512)
    metrics_path: str = Field(default="", max_length=512)

    _port = field_validator("port", mode="before")(exactly_int)

    @field_validator("health_path", "metrics_path")
    @classmethod
    def _path(cls, v: str) -> str:
        if v and not _PATH.match(v):
            raise ValueError("must be an absolute URL path such as /health")
        return v


def image_repository(image: str) -> str:
    """`registry:5000/org/name:tag@sha256:…` → `org/name` (lowercase)."""
    ref = image.strip().lower().split("@", 1)[0]
    slash, colon = ref.rfind("/"), ref.rfind(":")
    if colon > slash:
        ref = ref[:colon]
    parts = ref.split("/")
    if len(parts) > 1 and ("." in parts[0] or ":" in parts[0] or parts[0] == "localhost"):
        parts = parts[1:]
    return "/".join(parts)


def looks_like_inference(image: str, serving: ServingSpec | None) -> bool:
    """The heuristic for an empty `task_type`: a declared serving port, or an image whose
    repository names an inference server. An explicit task_type is never second-guessed."""
    return serving is not None or _WORDS.search(image_repository(image)) is not None


class ServingMetrics(BaseModel):
    """The router's figures for one target, published on `hf.serving.<target>.metrics`
    (core NATS) every `HETEROFLOW_SERVE_METRICS_INTERVAL_S`: the autoscaler's request metrics.
    Each gateway process publishes what it measured; a consumer sums them per target."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    target_id: str
    tenant_id: str
    gateway: str  # which gateway process measured them
    requests_per_second: float
    concurrent_requests: int
    latency_p95_ms: float
    queued_requests: int
    replicas: int
    ready_replicas: int
    # Seconds since this gateway's last request for the target began or ended, or since it
    # began watching the target when it has routed none (None: not measured). The
    # idle-sleep controller sleeps a target idle at every router for its timeout.
    idle_s: float | None = None
    at: datetime
    # Requests in flight on each replica (task id → count, zeros left out): the rollout
    # controller ends a draining replica once no router counts one on it.
    outstanding: dict[str, int] = Field(default_factory=dict)
    # The replicas this router knows are draining (it sends them nothing new).
    draining: list[str] = Field(default_factory=list)


# --- replica choice --------------------------------------------------------------------


@dataclass
class Replica:
    """One serving replica as the router sees it."""

    task_id: str
    address: str  # host:port reachable from the router
    ready: bool = False
    # Marked by a rollout: no new request goes to it; its in-flight ones finish.
    draining: bool = False
    outstanding: int = 0
    last_pick: int = 0  # when it was last chosen (a sequence number): equal loads take turns
    last_error: str = ""


def pick(replicas: Iterable[Replica], exclude: Iterable[str] = ()) -> Replica | None:
    """Least outstanding requests among the ready replicas; on a tie the least recently
    chosen (sequential callers alternate), then the first listed."""
    skip = set(exclude)
    best: Replica | None = None
    for r in replicas:
        if not r.ready or r.draining or r.task_id in skip:
            continue
        if best is None or (r.outstanding, r.last_pick) < (best.outstanding, best.last_pick):
            best = r
    return best


# --- request figures -------------------------------------------------------------------


# Latencies kept per second of the window for its p95: past this, a uniform sample.
SAMPLE_PER_SECOND = 128


@dataclass
class RequestWindow:
    """Requests/s and latency p95 over the last `window_s`, plus the live gauges.

    Finished requests are counted per second of their end; each second keeps at most
    SAMPLE_PER_SECOND of its latencies (a uniform sample once it has more), so the figures
    cost the same at 10 or 10,000 requests/s: a minute of them is at most 7,680 latencies to
    sort, never every request (sorting 600,000 stalled the event loop for hundreds of ms).
    """

    window_s: float = 60.0
    concurrent: int = 0
    queued: int = 0
    last_request_at: float | None = None
    # [second, requests ended in it, sample of their latencies], oldest first.
    _seconds: deque[list[Any]] = field(default_factory=deque)
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    def started(self, now: float) -> None:
        self.last_request_at = now

    def finished(self, now: float, latency_s: float) -> None:
        second = math.floor(now)
        seconds = self._seconds
        if seconds and seconds[-1][0] == second:
            bucket = seconds[-1]
            bucket[1] += 1
            sample: list[float] = bucket[2]
            if len(sample) < SAMPLE_PER_SECOND:
                sample.append(latency_s)
            else:  # reservoir sampling: each of the second's requests equally likely kept
                i = int(self._rng.random() * bucket[1])
                if i < SAMPLE_PER_SECOND:
                    sample[i] = latency_s
            return
        seconds.append([second, 1, [latency_s]])
        self._trim(now)

    def _trim(self, now: float) -> None:
        # A second goes once all of it is older than the window.
        while self._seconds and self._seconds[0][0] + 1 <= now - self.window_s:
            self._seconds.popleft()

    def figures(self, now: float) -> dict[str, float]:
        self._trim(now)
        count = sum(b[1] for b in self._seconds)
        return {
            "requests_per_second": round(count / self.window_s, 3),
            "concurrent_requests": self.concurrent,
            "latency_p95_ms": round(self._percentile(0.95, count) * 1000, 3),
            "queued_requests": self.queued,
        }

    def _percentile(self, q: float, count: int) -> float:
        """Nearest rank over the window, each kept latency standing for its second's share
        of requests (exact while no second had more than SAMPLE_PER_SECOND)."""
        if not count:
            return 0.0
        weighted: list[tuple[float, float]] = sorted(
            (lat, b[1] / len(b[2])) for b in self._seconds for lat in b[2]
        )
        rank = max(1, math.ceil(q * count))
        seen = 0.0
        for lat, weight in weighted:
            seen += weight
            if seen >= rank - 1e-9:
                return lat
        return weighted[-1][0]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]
