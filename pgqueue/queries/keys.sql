-- Concurrency keys: at most key_max_running jobs of one concurrency_key hold a slot at
-- once (pgqueue.key_models); a cap of 1 is a sequence. One statement admits and releases,
-- and the slots pass from job to job by hand-off, so a claim never looks at a key.
-- Written whole, as PostgreSQL runs it; values are parameters (%(name)s). The header says
-- what it does and why, what it locks, which indexes serve it and who calls it.
--
-- A keyed job is enqueued (or promoted) 'new' and gated NULL: out of both claim indexes.
-- KEY_SETTLE admits it ('held': it takes a slot and becomes claimable, gated as any job
-- of its tenant) or makes it 'waiting'. A held job keeps its slot while it runs, is given
-- back, or waits out a retry's backoff; when it finishes (done, cancelled; dead unless
-- DEAD_JOB_HOLDS_KEY), the KEY_SETTLE that runs in the same transaction as its exit gives
-- the slot back ('') and hands it to the key's oldest waiting job. A key's row exists
-- only while some of its slots are held.
--
-- Why two statements: KEY_SETTLE decides from its snapshot which jobs of a key wait. A
-- settle that gives a slot back must see every job made waiting before it holds the
-- key's row (else the slot could go unused while a job waits for it), so its key rows are
-- locked first, by KEY_LOCK, and KEY_SETTLE, the next statement, has a snapshot taken
-- after those locks (READ COMMITTED). Whatever else KEY_SETTLE reads of a key, it reads
-- under the key row's lock too, at the row's newest version, so a count is never stale.
--
-- Lock order (with claim.sql's): job rows, then limit rows, then key rows. A transaction
-- waits for key rows only in KEY_LOCK (in key order, the first key rows it takes) and,
-- in KEY_SETTLE, for the jobs it was given (its caller holds them already) and for a key
-- row another transaction is inserting (in key order); every other row KEY_SETTLE takes
-- SKIP LOCKED. One KEY_LOCK and KEY_SETTLE per transaction (key_store.settle).


-- name: KEY_LOCK
-- Lock, waiting, in key order, the rows of the concurrency keys of the jobs %(ids)s that
-- hold a slot and have finished (as KEY_SETTLE's gone): the keys whose slots KEY_SETTLE
-- gives back and hands on next.
-- Locks: those key rows, until the transaction ends.
-- Indexes: pgqueue_job_pkey, pgqueue_key_uniq.
-- Called by: key_store.settle and claim_store.turn, right before KEY_SETTLE, when they
--   give slots back.
WITH given AS MATERIALIZED (  -- by id alone: pgqueue_job_pkey in any plan
    SELECT concurrency_key, key_state, status FROM pgqueue_job WHERE id = ANY(%(ids)s::bigint[])
)
SELECT k.id FROM pgqueue_key k
 WHERE k.key = ANY(ARRAY(SELECT concurrency_key FROM given
                          WHERE key_state = 'held'
                            AND (status IN ('done', 'cancelled')
                                 OR (status = 'dead' AND NOT %(dead_holds)s))))
 ORDER BY k.key
   FOR UPDATE


-- name: KEY_SETTLE
-- Give back the slots of the jobs %(ids)s that hold one and have finished (done or
-- cancelled; dead too unless %(dead_holds)s), examine up to %(admit)s new keyed jobs,
-- oldest first, and, for every key touched (those jobs', and any key of %(ids)s), admit
-- its candidates in id order (its waiting jobs, then the new ones, by id) while a slot is
-- free: job i of a key is admitted when the slots held, with the i - 1 admitted before
-- it, are fewer than the cap of each of those i jobs (min over the prefix; a key's jobs
-- normally share one cap). A new job not admitted waits. An admitted job becomes
-- claimable (gated if a limit of its tenant applies); its queue is notified.
-- Key rows: updated, created (running > 0) or deleted (none held). A key whose row
-- another transaction holds (SKIP LOCKED), or creates meanwhile (ON CONFLICT DO NOTHING,
-- after waiting for it), admits nothing here: its new jobs stay new for the next settle.
-- Returns how many new jobs it examined (the caller looks again when it took %(admit)s).
-- Locks: the jobs %(ids)s that gave a slot back (held by the caller already), and their
--   keys' rows (by KEY_LOCK); up to %(admit)s new jobs, the waiting jobs admitted and the
--   other touched key rows, SKIP LOCKED (a waiting job an operator is cancelling is passed
--   over: the next one takes the slot); a key row being created, waiting.
-- Indexes: pgqueue_job_pkey (%(ids)s), pgqueue_job_key_new, pgqueue_job_key_waiting (one
--   range per touched key), pgqueue_key_uniq, pgqueue_limit_scope (the gate).
-- Called by: key_store.settle: claim_store.turn (exits of keyed jobs, or new keyed work
--   announced), the recorder's batches, cancellation, the reaps and each maintenance pass.
WITH given AS MATERIALIZED (  -- by id alone: pgqueue_job_pkey in any plan
    SELECT id, concurrency_key AS key, key_state, status FROM pgqueue_job
     WHERE id = ANY(%(ids)s::bigint[]) AND concurrency_key IS NOT NULL
),
gone AS MATERIALIZED (
    SELECT id, key FROM given
     WHERE key_state = 'held'
       AND (status IN ('done', 'cancelled') OR (status = 'dead' AND NOT %(dead_holds)s))
),
fresh AS MATERIALIZED (
    SELECT id, concurrency_key AS key, key_max_running AS cap FROM pgqueue_job
     WHERE status = 'queued' AND key_state = 'new'
     ORDER BY id
     LIMIT %(admit)s
       FOR UPDATE SKIP LOCKED
),
touched AS MATERIALIZED (
    SELECT key FROM gone
    UNION SELECT key FROM fresh
    UNION SELECT key FROM given
),
held AS MATERIALIZED (
    SELECT k.key, k.running FROM pgqueue_key k
     WHERE k.key = ANY(ARRAY(SELECT key FROM touched))  -- pgqueue_key_uniq lookups
     ORDER BY k.key
       FOR UPDATE SKIP LOCKED
),
base AS MATERIALIZED (
    SELECT t.key, h.key IS NOT NULL AS known, COALESCE(h.running, 0) - COALESCE(g.n, 0) AS running
      FROM touched t
      LEFT JOIN held h ON h.key = t.key
      LEFT JOIN (SELECT key, count(*) AS n FROM gone GROUP BY key) g ON g.key = t.key
),
waiting AS MATERIALIZED (
    SELECT b.key, b.known, b.running, w.id, w.key_max_running AS cap
      FROM base b CROSS JOIN LATERAL (
           SELECT id, key_max_running FROM pgqueue_job
            WHERE concurrency_key = b.key AND status = 'queued' AND key_state = 'waiting'
            ORDER BY id
            LIMIT GREATEST(COALESCE((SELECT h.key_max_running FROM pgqueue_job h
                                      WHERE h.concurrency_key = b.key AND h.status = 'queued'
                                        AND h.key_state = 'waiting'
                                      ORDER BY h.id LIMIT 1), 0) - b.running, 0)
              FOR UPDATE SKIP LOCKED) w
),
candidates AS MATERIALIZED (
    SELECT key, known, running, id, cap, FALSE AS fresh FROM waiting
    UNION ALL
    SELECT b.key, b.known, b.running, f.id, f.cap, TRUE FROM base b JOIN fresh f ON f.key = b.key
),
ranked AS MATERIALIZED (
    SELECT key, known, id, fresh, running + row_number() OVER w AS slot, min(cap) OVER w AS cap
      FROM candidates
    WINDOW w AS (PARTITION BY key ORDER BY id ROWS UNBOUNDED PRECEDING)
),
counts AS MATERIALIZED (
    SELECT b.key, b.known, b.running + count(r.id) AS running
      FROM base b LEFT JOIN ranked r ON r.key = b.key AND r.slot <= r.cap
     GROUP BY b.key, b.known, b.running
),
created AS (
    INSERT INTO pgqueue_key (key, running)
    SELECT key, running FROM counts WHERE NOT known AND running > 0 ORDER BY key
    ON CONFLICT (key) DO NOTHING
    RETURNING key
),
kept AS (
    UPDATE pgqueue_key k SET running = c.running
      FROM counts c
     WHERE k.key = c.key AND c.known AND c.running > 0 AND k.running <> c.running
       AND k.key = ANY(ARRAY(SELECT key FROM held))  -- pgqueue_key_uniq lookups
),
dropped AS (
    DELETE FROM pgqueue_key k USING counts c
     WHERE k.key = c.key AND c.known AND c.running <= 0
       AND k.key = ANY(ARRAY(SELECT key FROM held))  -- pgqueue_key_uniq lookups
),
moves AS (
    SELECT id, '' AS state FROM gone
    UNION ALL
    SELECT id, CASE WHEN slot <= cap THEN 'held' ELSE 'waiting' END FROM ranked
     WHERE (slot <= cap OR fresh) AND (known OR key IN (SELECT key FROM created))
),
moved AS (
    UPDATE pgqueue_job j
       SET key_state = m.state,
           gated = CASE m.state WHEN 'waiting' THEN NULL
                                WHEN 'held' THEN EXISTS (
                                    SELECT 1 FROM pgqueue_limit gl
                                     WHERE gl.tenant = j.tenant AND gl.queue IN ('', j.queue)
                                       AND (gl.max_running IS NOT NULL OR gl.rate_count IS NOT NULL
                                            OR gl.paused))
                                ELSE j.gated END
      FROM moves m
     WHERE j.id = m.id AND j.id = ANY(ARRAY(SELECT id FROM moves))  -- pgqueue_job_pkey lookups
    RETURNING j.queue, m.state
)
SELECT (SELECT count(*) FROM fresh) AS examined,
       (SELECT count(pg_notify(%(channel)s, queue))
          FROM (SELECT DISTINCT queue FROM moved WHERE state = 'held') q) AS woken
