"""The claim path's shape: how many statements claim, how long they are, and how many
distinct statement texts a worker prepares.

- Claim statements: the statements that lease jobs (JOB_CLAIM* and
  JOB_COMPLETE_AND_CLAIM*), read from the modules as a worker runs them: the named
  statements of ``pgqueue/queries/*.sql`` and the JOB_CLAIM* / JOB_COMPLETE_AND_CLAIM*
  strings of ``pgqueue.sql``. Lines: non-blank lines of the text PostgreSQL receives.
- Modules: the longest Python module of ``pgqueue/`` (``.sql`` files hold whole
  statements only and are not counted).
- Texts: two workers (``WorkerLoop``, in this process, 8 threads each; one of one queue,
  one of two) drain no-op jobs of 100 tenants, 10 of them capped at 2, one queue capped
  too. Every statement a worker's loop thread sends is recorded (psycopg's execute,
  wrapped): the distinct texts it sent, claims, outcomes and maintenance alike, and of
  them the claims (the texts that add an attempt); and its
  connection's ``pg_prepared_statements`` at the end (psycopg prepares a text once it has
  run it 5 times).

    python scripts/with_db.py -- python -m bench.claim_shape [--quick]
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

from bench.common import ROOT, reset_tables, table


def claim_statements() -> dict[str, str]:
    """Name -> text of every statement that leases jobs."""
    from pgqueue import sql

    found = {
        name: value
        for name, value in vars(sql).items()
        if isinstance(value, str) and name.startswith(("JOB_CLAIM", "JOB_COMPLETE_AND_CLAIM"))
    }
    queries = ROOT / "pgqueue" / "queries"
    if queries.is_dir():
        from pgqueue.queries import load

        for path in sorted(queries.glob("*.sql")):
            found.update({k: v for k, v in load(path.name).items() if k.startswith(("JOB_CLAIM",))})
    return found


def lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip())


def longest_module() -> tuple[str, int]:
    sizes = {
        str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
        for p in (ROOT / "pgqueue").rglob("*.py")
        if "migrations" not in p.parts
    }
    name = max(sizes, key=sizes.__getitem__)
    return name, sizes[name]


#: A statement that leases jobs: it adds an attempt (in every form of the claim, past and
#: present: ``+ 1``, or ``+ t.run::int`` where one statement also gated stale jobs).
CLAIMS = re.compile(r"attempts = j\.attempts \+ (1|t\.run::int)")


def texts_of_workers(jobs: int) -> list[tuple[int, int, int]]:
    """(distinct texts sent, of them claims, texts prepared) of each of two in-process
    workers while they drain ``jobs`` no-op jobs (see the module's docstring)."""
    import psycopg

    import pgqueue
    from pgqueue import limits
    from pgqueue.worker.runtime import WorkerLoop

    reset_tables()
    tenants = [f"t{i:02}" for i in range(100)]
    for tenant in tenants[:10]:
        limits.set_tenant_limits(tenant, max_running=2)
    limits.set_queue_limits("capped", max_running=4)
    for tenant in tenants:
        for queue in ("default", "capped", "other"):
            pgqueue.enqueue_many("bench.noop", [None] * (jobs // 300), tenant=tenant, queue=queue)
    loops = [
        WorkerLoop(queues=["default"], concurrency=8, burst=True),
        WorkerLoop(queues=["capped", "other"], concurrency=8, burst=True),
    ]
    sent: dict[int, set[str]] = {}
    prepared: dict[int, int] = {}
    originals = {cls: cls.execute for cls in (psycopg.Cursor, psycopg.RawCursor)}

    def recording(cls: Any) -> Any:
        def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            texts = sent.get(threading.get_ident())
            if texts is not None and isinstance(query, str | bytes):
                texts.add(query if isinstance(query, str) else query.decode())
            return originals[cls](self, query, *args, **kwargs)

        return execute

    def run(loop: Any) -> None:
        sent[threading.get_ident()] = set()
        original = loop._shutdown

        def shutdown() -> None:  # count on the loop's own connection before it closes
            assert loop.db is not None
            with loop.db.cursor() as cur:
                cur.execute("SELECT count(*) FROM pg_prepared_statements")
                prepared[threading.get_ident()] = int(cur.fetchone()[0])
            original()

        loop._shutdown = shutdown
        loop.run()

    for cls in originals:
        cls.execute = recording(cls)  # type: ignore[method-assign]
    try:
        threads = [threading.Thread(target=run, args=(loop,)) for loop in loops]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for cls, method in originals.items():
            cls.execute = method  # type: ignore[method-assign]
    return [
        (
            len(sent[t.ident]) - 1,  # less the count above
            sum(1 for text in sent[t.ident] if CLAIMS.search(text)),
            prepared.get(t.ident, 0),
        )
        for t in threads
        if t.ident is not None
    ]


def run(quick: bool, out_dir: Path) -> dict[str, Any]:
    jobs = 3_000 if quick else 30_000
    statements = claim_statements()
    biggest = max(statements, key=lambda k: lines(statements[k]))
    module, module_lines = longest_module()
    texts = texts_of_workers(jobs)
    report = table(
        ["figure", "value"],
        [
            ["claim statements", len(statements)],
            ["their lines, in all", sum(lines(t) for t in statements.values())],
            [f"largest ({biggest}), lines", lines(statements[biggest])],
            [f"longest module ({module}), lines", module_lines],
            *[
                [
                    f"worker of {n} queue{'s' if n > 1 else ''}: texts sent (claims), prepared",
                    f"{a} ({c}), {b}",
                ]
                for n, (a, c, b) in enumerate(texts, 1)
            ],
        ],
    )
    report += "\nclaim statements: " + ", ".join(sorted(statements))
    method = (
        "Static: the statements that lease jobs as the worker runs them (JOB_CLAIM* and "
        "JOB_COMPLETE_AND_CLAIM*), non-blank lines of their text; the longest Python module "
        "of pgqueue/ (migrations aside). Measured: two in-process WorkerLoops (8 threads "
        "each; one of queue 'default', one of 'capped' and 'other') drain "
        f"{jobs:,} no-op jobs of 100 tenants, 10 capped at 2 and queue 'capped' capped at 4; "
        "the distinct statement texts each loop thread sent (psycopg's execute, wrapped), "
        "and pg_prepared_statements on its own connection at the end."
    )
    return {
        "title": "Claim path shape",
        "method": method,
        "report": report,
        "figures": {
            "claim_statements": sorted(statements),
            "claim_lines": {k: lines(v) for k, v in statements.items()},
            "longest_module": [module, module_lines],
            "texts_sent_and_prepared": texts,
        },
    }


if __name__ == "__main__":
    from bench.common import standalone

    standalone(run, __doc__)
