-- pg2kafka V010: snapshot bookkeeping (docs/snapshots.md).
--
-- A snapshot brings the rows a table already holds into the stream as `op: read` events.
-- Its work is split into chunks (page ranges of the table, or of each of its partitions);
-- a chunk is recorded as done only after Kafka acknowledged every event read from it, so
-- a snapshot killed at any point resumes at its first unfinished chunk, never at the
-- start of a table, and never loses one.
--
-- * _walcast.snapshots        one run (the initial snapshot of a slot, or a later one);
-- * _walcast.snapshot_tables  its tables, with progress counters and the start version S
--                             (the lowest version of its rows: the sweep bound of the
--                             end marker);
-- * _walcast.snapshot_chunks  its chunks: page or key range, state, rows read, the
--                             version the rows carried;
-- * _walcast.snapshot_requests the signal table: requests for incremental snapshots.
--
-- Only the owner (the role pg2kafka runs as) reads or writes them: they hold no row data,
-- but the table names and sizes of everything the owner streams.
-- Idempotent.

CREATE TABLE IF NOT EXISTS _walcast.snapshots (
    id           bigserial PRIMARY KEY,
    slot         text        NOT NULL,
    kind         text        NOT NULL CHECK (kind IN ('initial', 'incremental')),
    state        text        NOT NULL DEFAULT 'running'
                             CHECK (state IN ('running', 'done', 'cancelled', 'failed')),
    -- The version the run started at: the slot's restart_lsn - 1, read before any read.
    version      pg_lsn      NOT NULL,
    -- The source the rows came from (a restored or promoted server is another source).
    system_identifier numeric,
    timeline     int,
    requested_by text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz,
    error        text
);

CREATE INDEX IF NOT EXISTS snapshots_slot_state ON _walcast.snapshots (slot, state);

CREATE TABLE IF NOT EXISTS _walcast.snapshot_tables (
    snapshot_id   bigint      NOT NULL REFERENCES _walcast.snapshots ON DELETE CASCADE,
    schema_name   text        NOT NULL,
    table_name    text        NOT NULL,
    ord           int         NOT NULL,
    rows_estimate bigint,
    rows_done     bigint      NOT NULL DEFAULT 0,
    chunks_total  int         NOT NULL,
    chunks_done   int         NOT NULL DEFAULT 0,
    start_lsn     pg_lsn      NOT NULL,
    -- The table's last truncate or re-creation the stream saw during the run: a chunk
    -- read after it carries a version at least this (else the sinks, which keep changes
    -- older than a truncate out, would refuse its rows).
    floor_lsn     pg_lsn,
    state         text        NOT NULL DEFAULT 'pending'
                              CHECK (state IN ('pending', 'running', 'done')),
    started_at    timestamptz,
    finished_at   timestamptz,
    PRIMARY KEY (snapshot_id, schema_name, table_name)
);

CREATE TABLE IF NOT EXISTS _walcast.snapshot_chunks (
    snapshot_id bigint      NOT NULL,
    schema_name text        NOT NULL,
    table_name  text        NOT NULL,
    chunk       int         NOT NULL,
    -- Page-range chunks: the relation holding the rows (the table, or one of its
    -- partitions) and its pages [first_page, end_page); end_page NULL: to the end of the
    -- relation, whatever it has grown to by the time the chunk is read.
    relation    oid,
    first_page  bigint,
    end_page    bigint,
    -- Key-range chunks (incremental snapshots of keyed tables): keys in
    -- [lower_key, upper_key), each a JSON array of the key columns' text; NULL: unbounded.
    lower_key   jsonb,
    upper_key   jsonb,
    state       text        NOT NULL DEFAULT 'pending'
                            CHECK (state IN ('pending', 'running', 'done')),
    rows        bigint,
    version     pg_lsn,
    done_at     timestamptz,
    PRIMARY KEY (snapshot_id, schema_name, table_name, chunk),
    FOREIGN KEY (snapshot_id, schema_name, table_name)
        REFERENCES _walcast.snapshot_tables ON DELETE CASCADE
);

CREATE INDEX IF NOT EXISTS snapshot_chunks_pending
    ON _walcast.snapshot_chunks (snapshot_id, state);

-- The signal table: a row asks for an incremental snapshot of one table of a
-- publication (`pg2kafka snapshot --table`, an operator's INSERT, or the DDL trigger when
-- a table joins the publication with rows already in it). pg2kafka streaming that
-- publication takes it within seconds (taken_by: the snapshot run).
CREATE TABLE IF NOT EXISTS _walcast.snapshot_requests (
    id           bigserial   PRIMARY KEY,
    publication  text        NOT NULL,
    schema_name  text        NOT NULL,
    table_name   text        NOT NULL,
    reason       text        NOT NULL DEFAULT 'requested',
    requested_by text        NOT NULL DEFAULT current_user,
    requested_at timestamptz NOT NULL DEFAULT now(),
    taken_by     bigint      REFERENCES _walcast.snapshots ON DELETE SET NULL,
    taken_at     timestamptz
);

CREATE INDEX IF NOT EXISTS snapshot_requests_open
    ON _walcast.snapshot_requests (publication) WHERE taken_at IS NULL;

REVOKE ALL ON _walcast.snapshots, _walcast.snapshot_tables, _walcast.snapshot_chunks,
    _walcast.snapshot_requests FROM PUBLIC;
REVOKE ALL ON SEQUENCE _walcast.snapshots_id_seq, _walcast.snapshot_requests_id_seq
    FROM PUBLIC;
