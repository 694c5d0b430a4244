"""Concurrency keys with real ``runworker`` processes (tests/workers.py)."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

import pytest
from django.db import transaction

import pgqueue
from pgqueue.key_models import ConcurrencyKey
from pgqueue.models import Job, JobAttempt
from tests.test_limits_workers import all_done, max_overlap
from tests.workers import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

QUICK = {"POLL_SECONDS": 0.2, "MAINTENANCE_SECONDS": 0.5}

#: Keys raced in the exactness test, and its waves (each key's jobs per wave).
KEYS = ("key-a", "key-b", "key-c")
WAVES = 40


def spans_by_key(ids: list[int]) -> dict[str, list[tuple[dt.datetime, dt.datetime]]]:
    spans: dict[str, list[tuple[dt.datetime, dt.datetime]]] = defaultdict(list)
    for key, start, end in JobAttempt.objects.filter(job_id__in=ids).values_list(
        "job__concurrency_key", "started_at", "finished_at"
    ):
        spans[key].append((start, end))
    return spans


def test_sequences_run_in_enqueue_order_across_two_workers(workers):
    """Each key's jobs start one at a time, in enqueue order, whichever worker runs them,
    and every key's row is gone once its jobs are done."""
    ids = pgqueue.enqueue_many(
        "test.sleep",
        [{"seconds": 0.01, "n": n} for n in range(40)],
        concurrency_key=lambda p: f"user:{p['n'] % 4}",
    )
    for _ in range(2):
        workers("--concurrency", "4", settings=QUICK)
    wait_for(lambda: all_done(ids), 60, "every keyed job to finish")
    for key, spans in spans_by_key(ids).items():
        assert max_overlap(spans) == 1, key
    for n in range(4):
        key_ids = [i for i in ids if (ids.index(i) % 4) == n]
        starts = dict(
            JobAttempt.objects.filter(job_id__in=key_ids).values_list("job_id", "started_at")
        )
        assert sorted(key_ids, key=lambda i: starts[i]) == key_ids
    assert not ConcurrencyKey.objects.exists()


@pytest.mark.slow
@pytest.mark.parametrize("cap", [1, 3])
def test_a_key_cap_is_never_exceeded_by_8_workers_of_16_threads(workers, cap):
    """Protection: the key rows' locks. KEY_SETTLE reads a key's ``running`` under the
    row's lock (its ``held`` CTE) and writes the new count in the same statement, and a
    settle that gives slots back locks their rows first (KEY_LOCK), so that its snapshot
    shows every job made waiting before it. 128 handler threads of 8 processes race for
    three keys capped at ``cap``: the attempt history never shows more than ``cap`` of a
    key's jobs at once, and every job ends done (none left waiting with a slot free).

    The race has to be frequent for the test to be able to fail: small waves (cap + 1
    jobs a key, with jobs without a key between them), each enqueued in one commit whose
    wake-up ('key:default') sends all 8 workers admitting at once, two jobs per
    admission, while the previous wave still holds the keys' rows with slots free; the
    jobs are very short, so slots turn over all the time. Removed by hand, each lock made
    it fail: without KEY_LOCK, 3 runs out of 3 for both caps (a slot given back while a
    job became waiting unseen: jobs left waiting for good); without ``held``'s locking
    clause, 2 runs out of 3 for cap 3 (4 of a key at once, or a count gone wrong and jobs
    left waiting). Cap 1 passed without ``held``'s lock: a key's row exists only while a
    slot is held, so an unlocked read can only find it full, and two admissions that find
    no row race on its unique key (ON CONFLICT DO NOTHING), where one of them admits
    nothing. ``test_two_admissions_of_one_key_fill_its_free_slots_once`` (test_keys.py)
    takes the lock away deterministically."""
    # Admissions of two jobs at a time: 8 workers admit a wave's jobs side by side.
    fast = {"POLL_SECONDS": 0.05, "MAINTENANCE_SECONDS": 0.5, "KEY_ADMIT_BATCH": 2}
    procs = [workers("--concurrency", "16", "--prefetch", "0", settings=fast) for _ in range(8)]
    for p in procs:
        p.registered()
    everything: list[int] = []
    for _ in range(WAVES):
        with transaction.atomic():  # one commit: one wake-up for every worker
            ids: list[int] = []
            for key in KEYS:
                ids += pgqueue.enqueue_many(
                    "test.sleep",
                    [{"seconds": 0.003}] * (cap + 1),
                    concurrency_key=key,
                    key_max_running=cap,
                )
                ids += pgqueue.enqueue_many("test.sleep", [{"seconds": 0.002}] * 8)
        everything += ids
        # The next wave comes while this one runs: its keys' rows are held with slots
        # free, so admissions race with hand-offs and with one another on rows that exist.
        wait_for(
            lambda ids=ids: Job.objects.filter(id__in=ids, status="done").count() >= len(ids) // 2,
            90,
            "half of the wave to finish",
        )
    wait_for(lambda: all_done(everything), 120, "every job to finish")
    spans = spans_by_key(everything)
    for key in KEYS:
        assert len(spans[key]) == WAVES * (cap + 1)
        assert 1 <= max_overlap(spans[key]) <= cap, key
    assert not ConcurrencyKey.objects.exists()
    assert not Job.objects.exclude(status="done").exists()
