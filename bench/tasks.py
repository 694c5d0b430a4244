"""Tasks the benchmarks enqueue."""

import pgqueue


@pgqueue.task(name="bench.noop")
def noop(payload, job):
    """Does nothing: what is measured is the queue's own cost per job."""
    return None
