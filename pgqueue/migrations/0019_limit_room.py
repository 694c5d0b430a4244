"""A limit row's tokens and room, as two SQL functions: the one definition that the claim
(pgqueue/queries/claim.sql) and the reads of limits use.

Both are IMMUTABLE SQL functions of the row and a time, so PostgreSQL inlines them into
the statements that call them: no call overhead, and the planner sees the expression.
"""

from django.db import migrations

TOKENS = """
CREATE OR REPLACE FUNCTION pgqueue_limit_tokens(l pgqueue_limit, at timestamptz)
RETURNS float8 LANGUAGE sql IMMUTABLE AS $$
    -- A token bucket of rate_count per rate_seconds, holding at most
    -- max(1, ceil(rate_count / 10)) (the burst): its tokens at ``at``, ``tokens`` being
    -- what it held at refilled_at. NULL without a rate limit.
    SELECT CASE WHEN l.rate_count IS NOT NULL THEN LEAST(
               GREATEST(1, ceil(l.rate_count / 10.0)),
               l.tokens + l.rate_count
                 * GREATEST(extract(epoch FROM at - COALESCE(l.refilled_at, at)), 0)
                 / l.rate_seconds) END
$$
"""

ROOM = """
CREATE OR REPLACE FUNCTION pgqueue_limit_room(l pgqueue_limit, at timestamptz, most int)
RETURNS int LANGUAGE sql IMMUTABLE AS $$
    -- The starts the row allows at ``at``, at most ``most``: none while paused; else the
    -- least of its cap's free slots and its whole tokens (LEAST skips the NULL of a limit
    -- it does not have).
    SELECT CASE WHEN l.paused THEN 0 ELSE GREATEST(0, LEAST(
               l.max_running - l.running, floor(pgqueue_limit_tokens(l, at))::int, most)) END
$$
"""


class Migration(migrations.Migration):
    dependencies = [("pgqueue", "0018_fair_clock_tenant_index")]

    operations = [
        migrations.RunSQL(
            TOKENS, "DROP FUNCTION IF EXISTS pgqueue_limit_tokens(pgqueue_limit, timestamptz)"
        ),
        migrations.RunSQL(
            ROOM, "DROP FUNCTION IF EXISTS pgqueue_limit_room(pgqueue_limit, timestamptz, int)"
        ),
    ]
