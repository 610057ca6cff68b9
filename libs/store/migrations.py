"""Schema migrations, applied on start under an advisory lock; each runs once (idempotent).

Append new migrations at the end; never edit one that has shipped.
"""

from __future__ import annotations

import psycopg

# A fixed key for pg_advisory_xact_lock so concurrent starters serialise on migrations.
_MIGRATION_LOCK = 0x4846_0001

MIGRATIONS: list[tuple[int, str]] = [
    (
        1,
        """
        CREATE TABLE events (
            position      bigserial PRIMARY KEY,
            event_id      uuid        NOT NULL UNIQUE,
            stream_id     text        NOT NULL,
            stream_type   text        NOT NULL,
            version       integer     NOT NULL CHECK (version > 0),
            type          text        NOT NULL,
            schema_version integer    NOT NULL DEFAULT 1,
            payload       jsonb       NOT NULL,
            metadata      jsonb       NOT NULL DEFAULT '{}'::jsonb,
            occurred_at   timestamptz NOT NULL,
            -- The writing transaction's id: the relay orders by (tx_id, position) and stops at
            -- the oldest still-running transaction, so a late commit is never skipped.
            tx_id         xid8        NOT NULL DEFAULT pg_current_xact_id(),
            UNIQUE (stream_id, version)
        );
        CREATE INDEX events_tx_position ON events (tx_id, position);
        CREATE INDEX events_stream_type ON events (stream_type, position);
        CREATE INDEX events_occurred_at ON events (occurred_at);

        -- Append-only: the store refuses to rewrite history.
        CREATE FUNCTION events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            RAISE EXCEPTION 'events is append-only (% refused)', TG_OP;
        END $$;
        CREATE TRIGGER events_no_update BEFORE UPDATE OR DELETE ON events
            FOR EACH ROW EXECUTE FUNCTION events_append_only();
        CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
            FOR EACH STATEMENT EXECUTE FUNCTION events_append_only();

        -- Wake the relay on commit (NOTIFY is delivered only when the transaction commits).
        CREATE FUNCTION events_notify() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_notify('hf_events', '');
            RETURN NULL;
        END $$;
        CREATE TRIGGER events_notify AFTER INSERT ON events
            FOR EACH STATEMENT EXECUTE FUNCTION events_notify();

        CREATE TABLE relay_checkpoints (
            name       text PRIMARY KEY,
            tx_id      xid8   NOT NULL,
            position   bigint NOT NULL,
            updated_at timestamptz NOT NULL DEFAULT now()
        );

        -- Projections (read models), written in the same transaction as the events.
        CREATE TABLE tasks (
            id          text PRIMARY KEY,
            tenant_id   text NOT NULL,
            status      text NOT NULL,
            name        text NOT NULL,
            node_id     text,
            priority    integer NOT NULL,
            group_id    text,
            labels      jsonb NOT NULL,
            version     integer NOT NULL,
            created_at  timestamptz NOT NULL,
            updated_at  timestamptz NOT NULL,
            deleted_at  timestamptz,
            doc         jsonb NOT NULL
        );
        CREATE INDEX tasks_tenant_created ON tasks (tenant_id, created_at DESC);
        CREATE INDEX tasks_status ON tasks (status);
        CREATE INDEX tasks_node ON tasks (node_id) WHERE node_id IS NOT NULL;

        CREATE TABLE tenants (
            id         text PRIMARY KEY,
            name       text NOT NULL UNIQUE,
            gpu_quota  integer NOT NULL,
            created_at timestamptz NOT NULL
        );

        CREATE TABLE api_keys (
            id         text PRIMARY KEY,
            tenant_id  text NOT NULL REFERENCES tenants(id),
            name       text NOT NULL,
            prefix     text NOT NULL,
            key_hash   text NOT NULL UNIQUE,
            created_at timestamptz NOT NULL,
            revoked_at timestamptz
        );

        CREATE TABLE system_credentials (
            id         text PRIMARY KEY,
            role       text NOT NULL,
            name       text NOT NULL,
            prefix     text NOT NULL,
            key_hash   text NOT NULL UNIQUE,
            created_at timestamptz NOT NULL
        );
        """,
    ),
    (
        2,
        """
        CREATE TABLE nodes (
            id            text PRIMARY KEY,
            status        text NOT NULL,
            version       integer NOT NULL,
            registered_at timestamptz NOT NULL,
            updated_at    timestamptz NOT NULL,
            doc           jsonb NOT NULL
        );
        CREATE INDEX tasks_pending ON tasks (priority DESC, created_at)
            WHERE status = 'pending' AND deleted_at IS NULL;
        """,
    ),
    (
        3,
        """
        CREATE TABLE groups (
            id          text PRIMARY KEY,
            tenant_id   text NOT NULL,
            status      text NOT NULL,
            name        text NOT NULL,
            version     integer NOT NULL,
            created_at  timestamptz NOT NULL,
            updated_at  timestamptz NOT NULL,
            deleted_at  timestamptz,
            doc         jsonb NOT NULL
        );
        CREATE INDEX groups_tenant_created ON groups (tenant_id, created_at DESC);
        CREATE INDEX tasks_group ON tasks (group_id) WHERE group_id IS NOT NULL;
        """,
    ),
    (
        4,
        """
        -- Fault-tolerance timeline: written by the event-timeline service from committed
        -- events (not a projection: not rebuilt by replay, never back-filled).
        CREATE TABLE timeline (
            id            text PRIMARY KEY,
            subject_type  text NOT NULL,
            subject_id    text NOT NULL,
            kind          text NOT NULL,
            message       text NOT NULL,
            details       jsonb NOT NULL,
            occurred_at   timestamptz NOT NULL,
            recorded_at   timestamptz NOT NULL DEFAULT now(),
            source_event  uuid NOT NULL
        );
        CREATE INDEX timeline_subject ON timeline (subject_type, subject_id, occurred_at DESC);
        CREATE INDEX timeline_occurred ON timeline (occurred_at);
        """,
    ),
    (
        5,
        """
        -- GPU telemetry samples per task and card (from agents through NVML); not events.
        CREATE TABLE gpu_samples (
            task_id          text NOT NULL,
            gpu_id           text NOT NULL,
            node_id          text NOT NULL,
            at               timestamptz NOT NULL,
            utilization_pct  real NOT NULL,
            memory_used_mb   real NOT NULL,
            memory_total_mb  real NOT NULL,
            power_w          real,
            shared_by        integer NOT NULL DEFAULT 1,
            PRIMARY KEY (task_id, gpu_id, at)
        );
        CREATE INDEX gpu_samples_at ON gpu_samples (at);
        """,
    ),
    (
        6,
        """
        -- Fencing: the newest token each lease has shown the store. A leader's write carries
        -- its (lease, token); the store raises this row to the greatest token it has seen and
        -- refuses a write whose token is older, in the same transaction (libs/store/fencing.py).
        CREATE TABLE fences (
            lease       text PRIMARY KEY,
            token       bigint NOT NULL,
            updated_at  timestamptz NOT NULL DEFAULT now()
        );

        -- Exactly once: an event consumer records (consumer, event id) in the transaction of
        -- its effect; a redelivered or republished event finds its receipt and changes nothing
        -- (libs/store/inbox.py).
        CREATE TABLE consumer_inbox (
            consumer    text NOT NULL,
            event_id    uuid NOT NULL,
            handled_at  timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (consumer, event_id)
        );
        CREATE INDEX consumer_inbox_handled ON consumer_inbox (consumer, handled_at);
        """,
    ),
    (
        7,
        """
        -- Events JetStream refused for good (too large): the relay records them here and goes
        -- on instead of retrying one event forever (libs/store/dead_letters.py).
        CREATE TABLE relay_dead_letters (
            relay       text        NOT NULL,
            event_id    uuid        NOT NULL,
            position    bigint      NOT NULL,
            stream_id   text        NOT NULL,
            stream_type text        NOT NULL,
            type        text        NOT NULL,
            subject     text        NOT NULL,
            size_bytes  integer     NOT NULL,
            error       text        NOT NULL,
            dead_at     timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (relay, event_id)
        );
        CREATE INDEX relay_dead_letters_dead_at ON relay_dead_letters (dead_at);
        """,
    ),
    (
        8,
        """
        -- Resource pools and queues (seed 004): projections of the pool-<name> and
        -- queue-<name> streams, one row per name (a re-created name continues its stream).
        CREATE TABLE pools (
            id          text PRIMARY KEY,
            name        text NOT NULL,
            version     integer NOT NULL,
            created_at  timestamptz NOT NULL,
            updated_at  timestamptz NOT NULL,
            deleted_at  timestamptz,
            doc         jsonb NOT NULL
        );
        CREATE TABLE queues (
            id          text PRIMARY KEY,
            name        text NOT NULL,
            tenant_id   text NOT NULL,
            version     integer NOT NULL,
            created_at  timestamptz NOT NULL,
            updated_at  timestamptz NOT NULL,
            deleted_at  timestamptz,
            doc         jsonb NOT NULL
        );
        CREATE INDEX queues_tenant ON queues (tenant_id);
        -- Queue usage and backlog read tasks by queue.
        CREATE INDEX tasks_queue ON tasks ((doc->'spec'->>'queue'), status)
            WHERE deleted_at IS NULL;
        """,
    ),
    (
        9,
        """
        -- Jobs (SPEC §7): projection of the job-… streams. A job's tasks carried its id as
        -- the label heteroflow.job (since migration 12: spec.platform.job_id); the index
        -- finds them for the DAG view.
        CREATE TABLE jobs (
            id          text PRIMARY KEY,
            tenant_id   text NOT NULL,
            status      text NOT NULL,
            name        text NOT NULL,
            version     integer NOT NULL,
            created_at  timestamptz NOT NULL,
            updated_at  timestamptz NOT NULL,
            deleted_at  timestamptz,
            doc         jsonb NOT NULL
        );
        CREATE INDEX jobs_tenant_created ON jobs (tenant_id, created_at DESC);
        CREATE INDEX tasks_job ON tasks ((labels->>'heteroflow.job'))
            WHERE labels ? 'heteroflow.job';
        """,
    ),
    (
        10,
        """
        -- Node-bound agent keys: the node a key acts for, the bcrypt hash the embedded NATS
        -- server checks for that node's user, and when a newer key for the node revoked it.
        ALTER TABLE system_credentials
            ADD COLUMN node_id            text,
            ADD COLUMN nats_password_hash text,
            ADD COLUMN revoked_at         timestamptz;
        CREATE INDEX system_credentials_node ON system_credentials (node_id)
            WHERE node_id IS NOT NULL;

        -- One-time join tokens: a node spends one to get its key (libs/auth.py).
        CREATE TABLE join_tokens (
            id          text PRIMARY KEY,
            prefix      text NOT NULL,
            key_hash    text NOT NULL UNIQUE,
            created_at  timestamptz NOT NULL,
            expires_at  timestamptz NOT NULL,
            used_at     timestamptz,
            node_id     text
        );
        """,
    ),
    (
        11,
        """
        -- A suspended tenant creates no new work and gets no scale-up (docs/autoscaling.md).
        ALTER TABLE tenants ADD COLUMN suspended boolean NOT NULL DEFAULT false;
        """,
    ),
    (
        12,
        r"""
        -- Reserved names (docs/api.md#reserved-names): the platform's own metadata moves
        -- from labels under `heteroflow.` into the spec's server-owned `platform`. The same
        -- upcast as `libs.domain.task.upcast_spec` (replayed events take that one): the
        -- two must give the same document, or replay reports the rows as different.
        UPDATE tasks SET doc = jsonb_set(doc, '{spec}', (doc->'spec') || jsonb_build_object(
            'labels', (SELECT coalesce(jsonb_object_agg(key, value), '{}'::jsonb)
                       FROM jsonb_each(doc->'spec'->'labels')
                       WHERE key NOT LIKE 'heteroflow.%'),
            'platform', jsonb_build_object(
                'job_id', coalesce(doc->'spec'->'labels'->>'heteroflow.job', ''),
                'job_key', coalesce(doc->'spec'->'labels'->>'heteroflow.job_key', ''),
                'surge_cards', CASE
                    WHEN doc->>'group_id' IS NOT NULL
                     AND doc->'spec'->'labels'->>'heteroflow.rollout_surge_cards'
                         ~ '^[0-9]+(\.[0-9]+)?$'
                    THEN (doc->'spec'->'labels'->>'heteroflow.rollout_surge_cards')::float8
                    ELSE 0.0 END,
                'static_world', doc->>'group_id' IS NOT NULL
                    AND coalesce(doc->'spec'->'labels'->>'heteroflow.static_world', '')
                        = 'true')))
        WHERE NOT (doc->'spec' ? 'platform');
        UPDATE tasks SET labels = doc->'spec'->'labels' WHERE labels <> doc->'spec'->'labels';
        DROP INDEX IF EXISTS tasks_job;
        CREATE INDEX tasks_job ON tasks ((doc->'spec'->'platform'->>'job_id'))
            WHERE doc->'spec'->'platform'->>'job_id' <> '';
        -- Member templates and a job's task specs gain the default `platform`.
        UPDATE groups SET doc = jsonb_set(doc, '{spec,template,platform}',
            '{"job_id": "", "job_key": "", "surge_cards": 0.0, "static_world": false}')
        WHERE NOT (doc->'spec'->'template' ? 'platform');
        UPDATE groups SET doc = jsonb_set(jsonb_set(doc, '{rollout,previous,platform}',
            '{"job_id": "", "job_key": "", "surge_cards": 0.0, "static_world": false}'),
            '{rollout,target,platform}',
            '{"job_id": "", "job_key": "", "surge_cards": 0.0, "static_world": false}')
        WHERE jsonb_typeof(doc->'rollout') = 'object'
          AND NOT (doc->'rollout'->'previous' ? 'platform');
        UPDATE jobs SET doc = jsonb_set(doc, '{spec,tasks}', (
            SELECT coalesce(jsonb_agg(CASE WHEN t->'spec' ? 'platform' THEN t
                ELSE jsonb_set(t, '{spec,platform}',
                    '{"job_id": "", "job_key": "", "surge_cards": 0.0, "static_world": false}')
                END ORDER BY o), '[]')
            FROM jsonb_array_elements(doc->'spec'->'tasks') WITH ORDINALITY AS e(t, o)))
        WHERE jsonb_typeof(doc->'spec'->'tasks') = 'array';
        """,
    ),
    (
        13,
        """
        -- Fields added with their defaults (a replayed row has them; a stored one must too,
        -- or replay reports it as different): a task's allocated host ports (docs/groups.md)
        -- and what a node's inventory says of its address space, isolation, user namespaces
        -- and cgroups (docs/runtimes.md). Values already present win over the defaults.
        UPDATE tasks SET doc = doc || '{"ports": {}}'::jsonb WHERE NOT (doc ? 'ports');
        UPDATE nodes SET doc = jsonb_set(doc, '{inventory}',
            '{"host_id": "", "port_range": [20000, 32000], "isolation": "",
              "userns_remap": false, "cgroups": ""}'::jsonb || (doc->'inventory'))
        WHERE jsonb_typeof(doc->'inventory') = 'object'
          AND NOT (doc->'inventory' ?& ARRAY['host_id', 'port_range', 'isolation',
                                              'userns_remap', 'cgroups']);
        """,
    ),
    (
        14,
        """
        -- A node's inventory says why a vendor's cards report no metrics (docs/runtimes.md,
        -- vendor telemetry): stored inventories gain the empty default, as replay gives.
        UPDATE nodes SET doc = jsonb_set(doc, '{inventory,telemetry}', '{}'::jsonb)
        WHERE jsonb_typeof(doc->'inventory') = 'object' AND NOT (doc->'inventory' ? 'telemetry');
        """,
    ),
    (
        15,
        """
        -- A task's variants and the one placed (docs/scheduling.md#variants), its device
        -- requeues and a node's quarantined cards (docs/operations.md, card quarantine):
        -- stored rows gain the defaults replay gives. Values already present win.
        UPDATE tasks SET doc = '{"variant": null, "requeues": 0}'::jsonb || doc
        WHERE NOT (doc ?& ARRAY['variant', 'requeues']);
        UPDATE tasks SET doc = jsonb_set(doc, '{spec,variants}', '[]'::jsonb)
        WHERE jsonb_typeof(doc->'spec') = 'object' AND NOT (doc->'spec' ? 'variants');
        UPDATE nodes SET doc = doc || '{"quarantined_gpus": []}'::jsonb
        WHERE NOT (doc ? 'quarantined_gpus');
        """,
    ),
]

# Tables rebuilt by replay (order matters for foreign keys: children first when clearing).
PROJECTION_TABLES: tuple[str, ...] = (
    "api_keys",
    "system_credentials",
    "join_tokens",
    "tasks",
    "nodes",
    "groups",
    "pools",
    "queues",
    "jobs",
    "tenants",
)


def migrate(conn: psycopg.Connection) -> list[int]:
    """Apply pending migrations; return the versions applied now."""
    applied: list[int] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
        for version, sql in MIGRATIONS:
            if version in done:
                continue
            conn.execute(sql)
            conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (version,))
            applied.append(version)
    return applied
