-- name: DATABASE_PING
-- The database half of `manage.py pgqueue healthcheck --readiness`: a new connection, made
-- with the worker's own connection parameters and a short connect timeout, answers a
-- statement. It reads no table: what it proves is that a worker of this host could connect
-- and be served now, not anything about the queue's rows.
-- Locks: none.
-- Index: none (no table).
-- Called by: pgqueue.worker.health.ping, from pgqueue.cli.health (the healthcheck command).
SELECT 1
