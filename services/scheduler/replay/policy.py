"""The policy a replay changes: `--set KEY=VALUE` parsed, and applied to what placement sees.

Keys (docs/operations.md, "Policy replay"):
* `quota.<tenant>.max_gpus=N`: the tenant's GPU quota in cards (0 = unlimited);
* `queue.<name>.max_gpus|max_running_jobs|max_running_tasks|priority=N`,
  `queue.<name>.policy=fifo|priority`: the queue's quota, its priority among queues and its
  order inside;
* `preemption=on|off`: off, no running work is preemptible.
An override holds for the whole window, whatever the log changes the setting to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from ..placement.model import Allocation, QueueLimits

QUEUE_INTS = ("max_gpus", "max_running_jobs", "max_running_tasks", "priority")


class PolicyError(ValueError):
    """A `--set` that names no setting a replay knows, or a value it cannot take."""


@dataclass(frozen=True)
class Policy:
    quotas: Mapping[str, float] = field(default_factory=dict)
    queues: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    preemption: bool = True
    sets: tuple[str, ...] = ()  # the settings as given, normalised, in order

    def __post_init__(self) -> None:
        object.__setattr__(self, "quotas", MappingProxyType(dict(self.quotas)))
        object.__setattr__(
            self, "queues", MappingProxyType({k: dict(v) for k, v in self.queues.items()})
        )

    @property
    def changed(self) -> bool:
        return bool(self.sets)

    def quotas_over(self, recorded: Mapping[str, float]) -> dict[str, float]:
        return {**recorded, **self.quotas}

    def queue_over(self, limits: QueueLimits) -> QueueLimits:
        over = self.queues.get(limits.name)
        return replace(limits, **over) if over else limits

    def allocation(self, alloc: Allocation) -> Allocation:
        return (
            alloc if self.preemption or not alloc.preemptible else replace(alloc, preemptible=False)
        )


def _int(key: str, value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise PolicyError(f"{key} must be a whole number >= 0 (got {value!r})") from None
    if n < 0:
        raise PolicyError(f"{key} must be a whole number >= 0 (got {value!r})")
    return n


def parse_sets(items: Iterable[str]) -> Policy:
    """The policy of `KEY=VALUE` settings; PolicyError names the first one refused."""
    quotas: dict[str, float] = {}
    queues: dict[str, dict[str, Any]] = {}
    preemption = True
    sets: list[str] = []
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise PolicyError(f"--set takes KEY=VALUE (got {item!r})")
        parts = key.split(".")
        if parts[0] == "quota" and len(parts) == 3 and parts[2] == "max_gpus" and parts[1]:
            quotas[parts[1]] = float(_int(key, value))
        elif parts[0] == "queue" and len(parts) == 3 and parts[1] and parts[2] in QUEUE_INTS:
            queues.setdefault(parts[1], {})[parts[2]] = _int(key, value)
        elif parts[0] == "queue" and len(parts) == 3 and parts[1] and parts[2] == "policy":
            if value not in ("fifo", "priority"):
                raise PolicyError(f"{key} must be fifo or priority (got {value!r})")
            queues.setdefault(parts[1], {})["fifo"] = value == "fifo"
        elif key == "preemption":
            if value not in ("on", "off"):
                raise PolicyError(f"preemption must be on or off (got {value!r})")
            preemption = value == "on"
        elif parts[0] == "autoscaler":
            raise PolicyError(f"{key}: the autoscaler's targets and cooldowns are not replayed")
        else:
            raise PolicyError(
                f"unknown setting {key!r}: quota.<tenant>.max_gpus, queue.<name>."
                "max_gpus|max_running_jobs|max_running_tasks|priority|policy, preemption"
            )
        sets.append(f"{key}={value}")
    return Policy(quotas, queues, preemption, tuple(sets))


def unknown_names(policy: Policy, tenants: Iterable[str], queues: Iterable[str]) -> list[str]:
    """Settings naming a tenant or a queue the log never mentions (likely a typo)."""
    known_t, known_q = set(tenants), set(queues)
    out = [f"quota.{t}" for t in policy.quotas if t not in known_t]
    return out + [f"queue.{q}" for q in policy.queues if q not in known_q]
