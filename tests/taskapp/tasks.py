"""Tasks the tests enqueue. The payload chooses the fate, so one task covers many cases."""

import pgqueue


@pgqueue.task(name="test.noop")
def noop(payload, job):
    return None


@pgqueue.task(name="test.echo")
def echo(payload, job):
    return payload


@pgqueue.task(name="test.limited", max_attempts=2, queue="limited", priority=7)
def limited(payload, job):
    return None
