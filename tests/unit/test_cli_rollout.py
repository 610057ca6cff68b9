"""`heteroflow groups rollout ...`: the flags become the request body, nothing more."""

from __future__ import annotations

from heteroflow.cli import build_parser
from heteroflow.cli_user.rollout import start_body


def test_start_sends_only_the_flags_given() -> None:
    args = build_parser().parse_args(
        [
            "groups",
            "rollout",
            "start",
            "grp-1",
            "--image",
            "app:v2",
            "--env",
            "A=1",
            "--env",
            "B=2",
            "--max-surge",
            "2",
            "--partition",
            "1",
            "--health-timeout",
            "30",
        ]
    )
    assert args.group_id == "grp-1"
    assert start_body(args) == {
        "image": "app:v2",
        "env": ["A=1", "B=2"],
        "max_surge": 2,
        "partition": 1,
        "health_timeout_s": 30,
    }
    bare = build_parser().parse_args(["groups", "rollout", "start", "grp-1", "--image", "x"])
    assert start_body(bare) == {"image": "x"}


def test_actions_parse() -> None:
    for action in ("pause", "resume", "rollback"):
        args = build_parser().parse_args(["groups", "rollout", action, "grp-1"])
        assert args.action == action and args.group_id == "grp-1"
    args = build_parser().parse_args(["groups", "rollout", "partition", "grp-1", "3"])
    assert args.partition == 3
