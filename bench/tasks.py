"""Tasks the benchmarks enqueue."""

import time

import pgqueue


@pgqueue.task(name="bench.noop")
def noop(payload, job):
    """Does nothing: what is measured is the queue's own cost per job."""
    return None


@pgqueue.task(name="bench.chaos", max_attempts=20)
def chaos(payload, job):
    """Sleeps ``payload["ms"]`` milliseconds, then records this execution as a side effect.

    The row in ``bench_execution`` (a table bench/chaos.py creates) is committed before the
    worker records the job as done, so a worker killed between the two leaves an execution
    whose job runs again: how often that happens is what bench/chaos.py counts. Attempts
    are many (20) so that a job unlucky enough to be in hand at several kills, or at the
    dropped connections, is still run rather than sent to the dead letters.
    """
    from django.db import connection

    time.sleep(payload["ms"] / 1000)
    with connection.cursor() as cur:
        cur.execute(
            "INSERT INTO bench_execution (job_id, attempt, at) VALUES (%s, %s, clock_timestamp())",
            [job.id, job.attempt],
        )
    return None


@pgqueue.task(name="bench.sleep5ms")
def sleep_5ms(payload, job):
    """Sleeps 5 ms and records nothing: a short job that waits, as I/O-bound work does."""
    time.sleep(0.005)


@pgqueue.task(name="bench.sleep_ms")
def sleep_ms(payload, job):
    """Sleeps ``payload["ms"]`` milliseconds: a long job that holds its slot (heavy_flood)."""
    time.sleep(payload["ms"] / 1000)
