"""The `heteroflow` command."""

from __future__ import annotations

import argparse
import asyncio
import sys

from libs.logging import configure


def _up(_: argparse.Namespace) -> int:
    from libs.platform import PlatformSettings, serve

    settings = PlatformSettings()
    configure(settings.log_level, settings.log_format)
    asyncio.run(serve(settings))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="heteroflow", description="Run GPU container work on heterogeneous fleets."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser(
        "up",
        help="start the platform (embedded NATS + PostgreSQL unless URLs are configured)",
    )
    up.set_defaults(func=_up)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
