"""``print`` output of a handler names its job: ``job=<id> `` in front of each line.

runworker wraps stdout and stderr in ``pgqueue.stdio.JobLines``; outside a job the text
passes through unchanged, and a job's lines are written whole, so concurrent jobs' lines
never mix.
"""

from __future__ import annotations

import io
import sys
import threading
from types import SimpleNamespace

import pytest

import pgqueue
from pgqueue import stdio
from pgqueue.log import job_context
from pgqueue.models import Job
from tests.workers import STARTUP, StartWorker


def fake_job(job_id: int) -> SimpleNamespace:
    """What JobLines reads of a job: its id (job_context only stores the object)."""
    return SimpleNamespace(id=job_id)


def test_outside_a_job_text_passes_through() -> None:
    out = io.StringIO()
    lines = stdio.JobLines(out)
    print("worker", "says", "hi", file=lines)
    print("no newline yet", end="", file=lines)
    assert out.getvalue() == "worker says hi\nno newline yet"


def test_a_jobs_lines_are_prefixed_and_its_last_line_ends_with_the_job() -> None:
    out = io.StringIO()
    lines = stdio.JobLines(out)
    job = fake_job(42)
    with job_context(job):  # type: ignore[arg-type]
        print("one", "two", file=lines)
        print("a\nb", file=lines)
        print("half", end="", file=lines)
        assert out.getvalue() == "job=42 one two\njob=42 a\njob=42 b\n"
        lines.end_job(job)  # type: ignore[arg-type]
    assert out.getvalue() == "job=42 one two\njob=42 a\njob=42 b\njob=42 half\n"


def test_concurrent_jobs_lines_never_mix() -> None:
    """Eight threads print 200 lines each, word by word (print writes each argument,
    separator and newline separately): every line comes out whole, with its own job.
    Without the per-job holding of unfinished lines, words of other jobs land mid-line."""
    out = io.StringIO()
    lines = stdio.JobLines(out)
    start = threading.Barrier(8)

    def body(n: int) -> None:
        with job_context(fake_job(n)):  # type: ignore[arg-type]
            start.wait()
            for i in range(200):
                print("line", i, "of", "job", n, file=lines)

    threads = [threading.Thread(target=body, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    written = out.getvalue().splitlines()
    assert len(written) == 8 * 200
    for n in range(8):
        mine = [line for line in written if line.startswith(f"job={n} ")]
        assert mine == [f"job={n} line {i} of job {n}" for i in range(200)]


def test_install_leaves_streams_the_project_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """A project that set sys.stdout itself (not sys.__stdout__) keeps it: install refuses."""
    own = io.StringIO()
    monkeypatch.setattr(sys, "stdout", own)
    before = sys.stdout, sys.stderr
    assert stdio.install() is False
    assert (sys.stdout, sys.stderr) == before


@pytest.mark.django_db(transaction=True)
def test_runworker_prefixes_a_handlers_print_with_its_job(workers: StartWorker) -> None:
    """A real worker: the handler's print to stdout and to stderr, and its unfinished last
    line, each come out as one line starting ``job=<id> ``. Before the wrapper they came
    out bare, with nothing saying which job printed them."""
    job, _ = pgqueue.enqueue("test.print", {"word": "hello-from-print"}, tenant="acme")
    w = workers("--burst", "--concurrency", "2")
    assert w.wait_exit(STARTUP) == 0
    assert Job.objects.get(pk=job.id).status == "done"
    lines = [line for line in w.log().splitlines() if "hello-from-print" in line]
    assert sorted(lines) == [
        f"job={job.id} printed hello-from-print",
        f"job={job.id} to stderr hello-from-print",
        f"job={job.id} unfinished hello-from-print",
    ], w.log()


def test_a_progress_bar_without_newlines_is_held_in_bounded_pieces() -> None:
    """A handler redrawing a progress bar with ``\\r`` and never a newline: what is held
    stays within MAX_LINE (written out as a line each time it reaches it), and every
    character comes out once, in order.

    Protection: the unfinished line is a list of pieces with a bound. Without it the
    whole line is held (and copied again on every write: 32,000 writes took 10 s)."""
    out = io.StringIO()
    lines = stdio.JobLines(out)
    lines.MAX_LINE = 1000  # type: ignore[misc]
    job = fake_job(7)
    written = [f"\r{n % 100:3d}%" for n in range(2000)]
    with job_context(job):  # type: ignore[arg-type]
        for piece in written:
            print(piece, end="", file=lines)
            assert lines._pending[7][1] <= 1000
        lines.end_job(job)  # type: ignore[arg-type]
    out_lines = out.getvalue().split("\n")[:-1]
    assert all(line.startswith("job=7 ") for line in out_lines)
    assert all(len(line) <= len("job=7 ") + 1000 for line in out_lines)
    assert "".join(line.removeprefix("job=7 ") for line in out_lines) == "".join(written)
