"""Subject naming: every subject is a valid NATS subject and ids round-trip."""

from __future__ import annotations

import pytest

from libs.bus import subjects as s


@pytest.mark.parametrize(
    ("value", "token"),
    [
        ("task-01HX_ab", "task-01HX_ab"),
        ("a.b", "a%2Eb"),
        ("a*b", "a%2Ab"),
        ("a>b", "a%3Eb"),
        ("a b\tc", "a%20b%09c"),
        ("100%", "100%25"),
        ("é", "%C3%A9"),
    ],
    ids=["safe", "dot", "star", "gt", "whitespace", "percent", "non-ascii"],
)
def test_escape_token(value: str, token: str) -> None:
    assert s.escape_token(value) == token
    assert s.unescape_token(token) == value


def test_empty_token_is_refused() -> None:
    with pytest.raises(ValueError):
        s.escape_token("")


@pytest.mark.parametrize(
    ("stream_type", "stream_id", "event_type", "subject"),
    [
        ("task", "task-abc", "task_created", "hf.events.task.task-abc.task_created"),
        ("tenant", "tenant-1", "api_key_issued", "hf.events.tenant.tenant-1.api_key_issued"),
        ("task", "x.y>z", "task_created", "hf.events.task.x%2Ey%3Ez.task_created"),
    ],
    ids=["task", "tenant", "escaped-id"],
)
def test_event_subject_round_trips(
    stream_type: str, stream_id: str, event_type: str, subject: str
) -> None:
    assert s.event_subject(stream_type, stream_id, event_type) == subject
    parsed = s.parse_event_subject(subject)
    assert (parsed.stream_type, parsed.stream_id, parsed.event_type) == (
        stream_type,
        stream_id,
        event_type,
    )


@pytest.mark.parametrize(
    ("subject",),
    [("hf.node.n1.cmd",), ("hf.events.task.a",), ("hf.events.task.a.b.c",), ("x.events.a.b.c",)],
    ids=["node", "too-short", "too-long", "other-root"],
)
def test_parse_event_subject_refuses_others(subject: str) -> None:
    with pytest.raises(ValueError):
        s.parse_event_subject(subject)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, "hf.events.*.*.*"),
        ({"stream_type": "task"}, "hf.events.task.*.*"),
        ({"stream_type": "task", "stream_id": "task-1"}, "hf.events.task.task-1.*"),
        ({"event_type": "task_deleted"}, "hf.events.*.*.task_deleted"),
    ],
    ids=["all", "type", "stream", "event-type"],
)
def test_event_filter(kwargs: dict[str, str], expected: str) -> None:
    assert s.event_filter(**kwargs) == expected


def test_node_subjects() -> None:
    assert s.node_command_subject("gpu-01") == "hf.node.gpu-01.cmd"
    assert s.node_report_subject("gpu-01") == "hf.node.gpu-01.report"
    assert s.node_heartbeat_subject("gpu-01") == "hf.node.gpu-01.heartbeat"
    assert s.node_command_subject("a.b") == "hf.node.a%2Eb.cmd"


def test_streams_cover_their_subjects() -> None:
    assert s.EVENTS_SUBJECTS == ("hf.events.>",)
    assert s.NODE_SUBJECTS == ("hf.node.*.cmd", "hf.node.*.report")
    assert s.dlq_subject("hf.events.task.t.x") == "hf.dlq.hf.events.task.t.x"
    assert s.max_deliveries_advisory("HF_EVENTS", "sched") == (
        "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.HF_EVENTS.sched"
    )
    assert s.DUPLICATE_WINDOW_S == 120.0
