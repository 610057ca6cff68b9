"""`--help` text listing every setting of a command: environment variable, default, meaning.

Generated from the pydantic-settings classes the command reads, so the list cannot drift from
the code. The classes are imported only when help is shown (`up` pulls in every service).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import SecretStr
from pydantic_settings import BaseSettings


class SettingsHelpParser(argparse.ArgumentParser):
    """An ArgumentParser whose help ends with a settings table computed on demand."""

    settings_help: Callable[[], str] | None = None

    def format_help(self) -> str:
        if self.settings_help is not None:
            self.epilog = self.settings_help()
        return super().format_help()


def _shown(value: Any) -> str:
    if value is None:
        return "unset"
    if value == "":
        return '""'
    if isinstance(value, SecretStr):
        return "(secret)"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


def _default(field: Any) -> str:
    if field.default_factory is None:
        return _shown(field.default)
    first, second = field.default_factory(), field.default_factory()
    return _shown(first) if first == second else "(generated)"


def settings_table(
    title: str, classes: Sequence[type[BaseSettings]], skip: set[str] | None = None
) -> str:
    """One line per environment variable of `classes` (first class wins on a shared name);
    the names in `skip` are left out, and the names listed are added to it."""
    seen = skip if skip is not None else set()
    rows: dict[str, tuple[str, str]] = {}
    for cls in classes:
        prefix = str(cls.model_config.get("env_prefix", ""))
        for name, field in cls.model_fields.items():
            env = f"{prefix}{name}".upper()
            if env not in seen:
                rows.setdefault(env, (_default(field), field.description or ""))
    seen.update(rows)
    width = max(len(env) for env in rows)
    lines = [f"{title} (environment variable, default, meaning):"]
    for env, (default, meaning) in rows.items():
        lines.append(f"  {env:<{width}}  {default}" + (f"  — {meaning}" if meaning else ""))
    return "\n".join(lines)


def up_settings() -> str:
    from agent.settings import AgentSettings
    from heteroflow.platform import PlatformSettings
    from heteroflow.services import SERVICES

    classes: list[type[BaseSettings]] = [PlatformSettings, *(spec.Settings for spec in SERVICES)]
    seen: set[str] = set()
    return "\n\n".join(
        [
            settings_table("settings", classes, seen),
            settings_table("settings of the local agent", [AgentSettings], seen),
        ]
    )


def agent_settings() -> str:
    from agent.settings import AgentSettings

    return settings_table("settings", [AgentSettings])
