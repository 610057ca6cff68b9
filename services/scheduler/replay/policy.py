"""The policy a replay changes: `--set KEY=VALUE` parsed, and applied to what placement sees.

Keys (docs/operations.md, "Policy replay"):
* `quota.<tenant>.max_gpus=N`: the tenant's GPU quota in cards (0 = unlimited);
* `queue.<name>.max_gpus|max_running_jobs|max_running_tasks|priority=N`,
  `queue.<name>.policy=fifo|priority`: the queue's quota, its priority among queues and its
  order inside;
* `preemption=on|off`: off, no running work is preemptible;
* `autoscaler.<group>.target|min_replicas|max_replicas|cooldown_up_s|cooldown_down_s=N`: a
  group's `auto_scale` (by id or name), replayed over its recorded samples (autoscale.py).
An override holds for the whole window, whatever the log changes the setting to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from ..placement.model import Allocation, QueueLimits

QUEUE_INTS = ("max_gpus", "max_running_jobs", "max_running_tasks", "priority")
AUTOSCALE_FIELDS = ("target", "min_replicas", "max_replicas", "cooldown_up_s", "cooldown_down_s")


class PolicyError(ValueError):
    """A `--set` that names no setting a replay knows, or a value it cannot take."""


@dataclass(frozen=True)
class Policy:
    quotas: Mapping[str, float] = field(default_factory=dict)
    queues: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    preemption: bool = True
    sets: tuple[str, ...] = ()  # the settings as given, normalised, in order
    autoscaler: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "quotas", MappingProxyType(dict(self.quotas)))
        object.__setattr__(
            self, "autoscaler", MappingProxyType({k: dict(v) for k, v in self.autoscaler.items()})
        )
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


def parse_autoscaler(key: str, group: str, name: str, value: str) -> tuple[str, str, Any]:
    """`autoscaler.<group>.<field>=value` → (group, field, value); PolicyError otherwise."""
    if not group or name not in AUTOSCALE_FIELDS:
        raise PolicyError(f"{key}: autoscaler.<group>.{'|'.join(AUTOSCALE_FIELDS)}")
    try:
        n: Any = int(value) if name in ("min_replicas", "max_replicas") else float(value)
    except ValueError:
        raise PolicyError(f"{key} must be a number (got {value!r})") from None
    if n < 0 or (name == "target" and n <= 0):
        raise PolicyError(f"{key} must be {'> 0' if name == 'target' else '>= 0'} (got {value!r})")
    return group, name, n


def parse_sets(items: Iterable[str]) -> Policy:
    """The policy of `KEY=VALUE` settings; PolicyError names the first one refused."""
    quotas: dict[str, float] = {}
    queues: dict[str, dict[str, Any]] = {}
    preemption = True
    autoscaler: dict[str, dict[str, Any]] = {}
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
        elif parts[0] == "autoscaler" and len(parts) == 3:
            group, name, n = parse_autoscaler(key, parts[1], parts[2], value)
            autoscaler.setdefault(group, {})[name] = n
        else:
            raise PolicyError(
                f"unknown setting {key!r}: quota.<tenant>.max_gpus, queue.<name>."
                "max_gpus|max_running_jobs|max_running_tasks|priority|policy, preemption, "
                "autoscaler.<group>.<field>"
            )
        sets.append(f"{key}={value}")
    return Policy(quotas, queues, preemption, tuple(sets), autoscaler)


def unknown_names(
    policy: Policy, tenants: Iterable[str], queues: Iterable[str], groups: Iterable[str] = ()
) -> list[str]:
    """Settings naming a tenant, a queue or a sampled group the log never mentions (likely a
    typo)."""
    known_t, known_q, known_g = set(tenants), set(queues), set(groups)
    out = [f"quota.{t}" for t in policy.quotas if t not in known_t]
    out += [f"autoscaler.{g}" for g in policy.autoscaler if g not in known_g]
    return out + [f"queue.{q}" for q in policy.queues if q not in known_q]
