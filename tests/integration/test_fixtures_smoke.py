from __future__ import annotations

import nats
import psycopg


def test_postgres_answers(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        assert conn.execute("select 1").fetchone() == (1,)


async def test_nats_jetstream_answers(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    info = await js.account_info()
    assert info.limits is not None
    await nc.close()
