"""Workflows: jobs that wait for other jobs — chains, fan-out and fan-in, any DAG.

A ``Workflow`` collects steps (a task, a payload, the enqueue options of a job) and the
dependencies between them, and enqueues them all in one transaction::

    wf = pgqueue.Workflow("ingest", tenant="acme")
    fetch = wf.add("fetch", {"url": url})
    parts = [wf.add("parse", {"part": i}, depends_on=[fetch]) for i in range(10)]
    wf.add("report", depends_on=parts, name="report")
    run = wf.enqueue()            # run.id, run.jobs == {"0": 41, ..., "report": 52}

A step waits in status 'waiting' until every dependency has ended; then it is scheduled
with a fresh fair vtime like any job of its tenant. When a dependency ends dead or
cancelled, the step is cancelled (and so its own dependents), unless it was added with
``on_upstream_failure="run"``. Its handler reads its dependencies' results as
``job.upstream_results``. ``chain``, ``group`` and ``chord`` build the common shapes.

How settling stays exact under concurrent ends, crashes and retries is in
``pgqueue/queries/workflows.sql``.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from django.db import connections, transaction

from . import store, tracing, workflow_store
from .conf import pgqueue_settings, queue_db
from .exceptions import InvalidJob
from .job_options import (
    MAX_BATCH,
    JobOptions,
    encode_payload,
    resolve_options,
    validate_name,
)
from .models import Workflow as WorkflowRow
from .registry import RegisteredTask

logger = logging.getLogger("pgqueue.workflows")

ON_UPSTREAM_FAILURE = ("cancel", "run")


@dataclass(eq=False)
class Step:
    """One job of a workflow, before it is enqueued (``Workflow.add``, ``pgqueue.step``)."""

    task: RegisteredTask | str
    payload: Any = None
    name: str | None = None
    depends_on: list[Step | str | int] = field(default_factory=list)
    on_upstream_failure: str = "cancel"
    options: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        task = self.task if isinstance(self.task, str) else self.task.name
        return f"<Step {self.name or '?'} {task}>"


def step(
    task: RegisteredTask | str,
    payload: Any = None,
    *,
    name: str | None = None,
    on_upstream_failure: str = "cancel",
    queue: str | None = None,
    priority: int | None = None,
    max_attempts: int | None = None,
    timeout: float | dt.timedelta | None = None,
    delay: float | dt.timedelta | None = None,
    run_at: dt.datetime | None = None,
    concurrency_key: str | None = None,
    key_max_running: int | None = None,
) -> Step:
    """A step for ``chain``, ``group`` and ``chord`` (Celery's signature): a task, its
    payload and the options its job is enqueued with."""
    options = {
        "queue": queue,
        "priority": priority,
        "max_attempts": max_attempts,
        "timeout": timeout,
        "delay": delay,
        "run_at": run_at,
        "concurrency_key": concurrency_key,
        "key_max_running": key_max_running,
    }
    return Step(
        task,
        payload,
        name=name,
        on_upstream_failure=on_upstream_failure,
        options={k: v for k, v in options.items() if v is not None},
    )


class Enqueued(NamedTuple):
    """What ``Workflow.enqueue`` returns: the workflow's row, and each step's job id by
    step name (a step added without a name is named by its position: "0", "1", ...)."""

    workflow: WorkflowRow
    jobs: dict[str, int]

    @property
    def id(self) -> int:
        return self.workflow.id


class Workflow:
    """A graph of steps of one tenant, enqueued in one transaction (see the module)."""

    def __init__(
        self,
        name: str = "",
        *,
        tenant: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
    ) -> None:
        if not isinstance(name, str) or len(name) > 200 or "\x00" in name:
            raise InvalidJob("name", "must be text of at most 200 characters, without NUL")
        self.name = name
        self.tenant = tenant
        self.queue = queue
        self.priority = priority
        self.steps: list[Step] = []

    def add(
        self,
        task: RegisteredTask | str | Step,
        payload: Any = None,
        *,
        name: str | None = None,
        depends_on: Iterable[Step | str | int] = (),
        on_upstream_failure: str = "cancel",
        **options: Any,
    ) -> Step:
        """Add a step (or a ``Step`` already built) and return it. ``depends_on`` names
        steps of this workflow (the ``Step`` or its name) or jobs of the tenant enqueued
        before (their ids). ``options`` are ``enqueue``'s: queue, priority, max_attempts,
        timeout, delay, run_at, concurrency_key, key_max_running."""
        if isinstance(task, Step):
            new = task
            new.depends_on = [*new.depends_on, *depends_on]
        else:
            new = Step(
                task,
                payload,
                name=name,
                depends_on=list(depends_on),
                on_upstream_failure=on_upstream_failure,
                options=options,
            )
        self.steps.append(new)
        return new

    def enqueue(self, *, tenant: str | None = None, using: str | None = None) -> Enqueued:
        """Enqueue every step in one transaction of ``using`` (inside the caller's, if
        one is open). Refuses, having written nothing, a graph with a cycle, over
        MAX_WORKFLOW_JOBS steps, a step over MAX_DEPENDENCIES dependencies, two steps of
        one name, or a dependency that is no job of the tenant (``InvalidJob`` naming
        the field). The steps with nothing to wait for become runnable when the
        transaction commits."""
        tenant = self.tenant if tenant is None else tenant
        plan = _plan(self, tenant)
        db = queue_db(using)
        with (
            tracing.enqueue_workflow(
                self.name, tenant=plan[0].opts.tenant, count=len(plan)
            ) as sending,
            transaction.atomic(using=db),
            connections[db].cursor() as cursor,
        ):
            external = sorted({u for p in plan for u in p.external})
            check_dependencies(cursor, external, plan[0].opts.tenant if plan else tenant)
            row_id, created_at = workflow_store.insert_workflow(
                cursor, tenant=plan[0].opts.tenant, name=self.name
            )
            sending.set(tracing.WORKFLOW_ID, row_id)
            ids = _insert(cursor, plan, row_id, sending.context)
            workflow_store.insert_dependencies(
                cursor,
                [(ids[p.index], ids[u]) for p in plan for u in p.internal]
                + [(ids[p.index], u) for p in plan for u in p.external],
            )
            first = [ids[p.index] for p in plan if not p.internal]
            transaction.on_commit(lambda: settle_after_commit(db, ids=first), using=db)
        row = WorkflowRow(id=row_id, tenant_id=plan[0].opts.tenant, name=self.name)
        row.created_at = created_at
        row._state.adding, row._state.db = False, db
        return Enqueued(row, {p.name: ids[p.index] for p in plan})


# -- the shortcuts ------------------------------------------------------------------------

#: What chain, group and chord take: a step, or a group of steps (a list or a Group).
Part = Step | Sequence[Step]


def chain(*parts: Part, name: str = "chain", tenant: str | None = None) -> Workflow:
    """Each part runs after the one before it has ended (a group: after all its steps;
    the steps of a group run side by side)."""
    wf = Workflow(name, tenant=tenant)
    previous: list[Step] = []
    for part in parts:
        steps = _steps(part)
        for s in steps:
            wf.add(s, depends_on=previous)
        previous = steps
    return wf


def group(*steps: Step, name: str = "group", tenant: str | None = None) -> Workflow:
    """Steps that run side by side, enqueued together."""
    wf = Workflow(name, tenant=tenant)
    for s in steps:
        wf.add(s)
    return wf


def chord(
    header: Sequence[Step], callback: Step, *, name: str = "chord", tenant: str | None = None
) -> Workflow:
    """``header`` side by side, then ``callback`` once every one of them is done (its
    handler reads their results as ``job.upstream_results``)."""
    return chain(list(header), callback, name=name, tenant=tenant)


def _steps(part: Part) -> list[Step]:
    if isinstance(part, Step):
        return [part]
    steps = list(part)
    if not steps or not all(isinstance(s, Step) for s in steps):
        raise InvalidJob("steps", "a part must be a step or a non-empty list of steps")
    return steps


# -- planning and inserting ---------------------------------------------------------------


@dataclass
class _Planned:
    index: int  # position in the insertion order (dependencies first)
    name: str
    step: Step
    opts: JobOptions
    payload_json: str
    internal: list[int]  # indexes (in the insertion order) of the steps it waits for
    external: list[int]  # ids of existing jobs it waits for
    depth: int


def _plan(wf: Workflow, tenant: str | None) -> list[_Planned]:
    """Check the graph and order it so that every step comes after its dependencies
    (their ids are then smaller: pgqueue_job_dep_older)."""
    s = pgqueue_settings
    steps = wf.steps
    if not steps:
        raise InvalidJob("jobs", "a workflow needs at least one job")
    if len(steps) > int(s.MAX_WORKFLOW_JOBS):
        raise InvalidJob(
            "jobs",
            f"has {len(steps)} jobs, more than {s.MAX_WORKFLOW_JOBS} "
            "(PGQUEUE['MAX_WORKFLOW_JOBS'])",
        )
    names: dict[str, int] = {}
    position = {id(st): i for i, st in enumerate(steps)}
    for i, st in enumerate(steps):
        if id(st) in position and position[id(st)] != i:
            raise InvalidJob("jobs", f"step {st!r} was added twice")
        name = str(i) if st.name is None else validate_name(st.name, f"jobs[{i}].name")
        if name in names:
            raise InvalidJob(f"jobs[{i}].name", f"{name!r} names two steps")
        names[name] = i
    deps: list[tuple[list[int], list[int]]] = []
    for i, st in enumerate(steps):
        internal: list[int] = []
        external: list[int] = []
        for d in st.depends_on:
            if isinstance(d, Step):
                if id(d) not in position:
                    raise InvalidJob(f"jobs[{i}].depends_on", f"{d!r} is not in this workflow")
                internal.append(position[id(d)])
            elif isinstance(d, str):
                if d not in names:
                    raise InvalidJob(f"jobs[{i}].depends_on", f"no step named {d!r}")
                internal.append(names[d])
            elif isinstance(d, int) and not isinstance(d, bool):
                external.append(d)
            else:
                raise InvalidJob(f"jobs[{i}].depends_on", "must list steps, step names or job ids")
        internal = list(dict.fromkeys(internal))
        external = list(dict.fromkeys(external))
        if i in internal:
            raise InvalidJob(f"jobs[{i}].depends_on", "a step cannot depend on itself")
        if len(internal) + len(external) > int(s.MAX_DEPENDENCIES):
            raise InvalidJob(
                f"jobs[{i}].depends_on",
                f"has {len(internal) + len(external)} dependencies, more than "
                f"{s.MAX_DEPENDENCIES} (PGQUEUE['MAX_DEPENDENCIES'])",
            )
        if st.on_upstream_failure not in ON_UPSTREAM_FAILURE:
            raise InvalidJob(f"jobs[{i}].on_upstream_failure", "must be 'cancel' or 'run'")
        deps.append((internal, external))
    order = _topological(deps, [n for n, _ in sorted(names.items(), key=lambda x: x[1])])
    at = {old: new for new, old in enumerate(order)}
    depth: dict[int, int] = {}
    plan: list[_Planned] = []
    for old in order:
        st = steps[old]
        internal, external = deps[old]
        depth[old] = 1 + max((depth[u] for u in internal), default=-1)
        options = dict(st.options)
        options.setdefault("queue", wf.queue)
        options.setdefault("priority", wf.priority)
        for key in ("idempotency_key", "tenant", "using"):
            if key in options:
                raise InvalidJob(f"jobs[{old}].{key}", "is not an option of a workflow's step")
        try:
            opts = resolve_options(st.task, tenant=tenant, **options)
        except TypeError as exc:
            raise InvalidJob(f"jobs[{old}]", str(exc)) from None
        except InvalidJob as exc:
            raise InvalidJob(f"jobs[{old}].{exc.field}", exc.reason) from None
        plan.append(
            _Planned(
                index=at[old],
                name=str(old) if st.name is None else st.name,
                step=st,
                opts=opts,
                payload_json=encode_payload(st.payload, f"jobs[{old}].payload"),
                internal=[at[u] for u in internal],
                external=external,
                depth=depth[old],
            )
        )
    return plan


def _topological(deps: list[tuple[list[int], list[int]]], names: list[str]) -> list[int]:
    """Kahn's order (stable: the order steps were added, where the graph allows); a cycle
    is refused, naming its steps."""
    waiting_on = [len(set(internal)) for internal, _ in deps]
    dependents: list[list[int]] = [[] for _ in deps]
    for i, (internal, _) in enumerate(deps):
        for u in internal:
            dependents[u].append(i)
    ready = [i for i, n in enumerate(waiting_on) if n == 0]
    order: list[int] = []
    while ready:
        ready.sort(reverse=True)
        i = ready.pop()
        order.append(i)
        for d in dependents[i]:
            waiting_on[d] -= 1
            if waiting_on[d] == 0:
                ready.append(d)
    if len(order) < len(deps):
        cycle = _a_cycle(deps, set(range(len(deps))) - set(order))
        raise InvalidJob("depends_on", "a cycle: " + " -> ".join(names[i] for i in cycle))
    return order


def _a_cycle(deps: list[tuple[list[int], list[int]]], left: set[int]) -> list[int]:
    """One cycle among the steps ``left`` (each waits for another of them)."""
    start = min(left)
    seen: dict[int, int] = {}
    path: list[int] = []
    node = start
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        node = next(u for u in deps[node][0] if u in left)
    return [*path[seen[node] :], node][::-1]


def _insert(
    cursor: Any, plan: list[_Planned], workflow: int, trace: tracing.TraceContext | None
) -> list[int]:
    """Insert the planned steps, waiting, dependencies first: level by level, each level's
    steps of the same task and options in statements of up to MAX_BATCH jobs. Returns the
    new ids by plan index. Every step records ``trace``, the workflow's producer span."""
    ids: list[int] = [0] * len(plan)
    by_level: dict[int, dict[tuple[Any, ...], list[_Planned]]] = {}
    for p in plan:
        key = (p.opts, p.step.on_upstream_failure)
        by_level.setdefault(p.depth, {}).setdefault(key, []).append(p)
    for level in sorted(by_level):
        for (opts, on_failure), members in by_level[level].items():
            keys = opts.keys([m.step.payload for m in members])
            for start in range(0, len(members), MAX_BATCH):
                chunk = members[start : start + MAX_BATCH]
                inserted, _ = store.enqueue(
                    cursor,
                    task=opts.task,
                    tenant=opts.tenant,
                    queue=opts.queue,
                    priority=opts.priority,
                    max_attempts=opts.max_attempts,
                    payloads_json=f"[{','.join(m.payload_json for m in chunk)}]",
                    count=len(chunk),
                    run_at=opts.run_at,
                    timeout=opts.timeout,
                    max_queues=pgqueue_settings.MAX_QUEUES_PER_TENANT,
                    keys=None if keys is None else keys[start : start + MAX_BATCH],
                    key_max_running=opts.key_max_running,
                    waiting=True,
                    workflow=workflow,
                    steps=[m.name for m in chunk],
                    run_anyway=on_failure == "run",
                    trace=trace,
                )
                for m, new in zip(chunk, inserted, strict=True):
                    ids[m.index] = new.id
    return ids


# -- dependencies of any job --------------------------------------------------------------


def dependency_ids(depends_on: Any) -> list[int]:
    """``depends_on`` of an enqueue call (jobs or ids), checked for shape and size."""
    from .models import Job

    if depends_on is None:
        return []
    if isinstance(depends_on, str | bytes | dict) or not isinstance(depends_on, Iterable):
        raise InvalidJob("depends_on", "must be a list of job ids")
    ids: list[int] = []
    for d in depends_on:
        if isinstance(d, Job):
            d = d.pk
        if isinstance(d, bool) or not isinstance(d, int) or d < 1:
            raise InvalidJob("depends_on", "must be a list of job ids")
        ids.append(d)
    ids = list(dict.fromkeys(ids))
    bound = int(pgqueue_settings.MAX_DEPENDENCIES)
    if len(ids) > bound:
        raise InvalidJob(
            "depends_on",
            f"has {len(ids)} dependencies, more than {bound} (PGQUEUE['MAX_DEPENDENCIES'])",
        )
    return ids


def check_dependencies(cursor: Any, ids: Sequence[int], tenant: str | None) -> None:
    """Refuse (``InvalidJob`` naming depends_on) ids that name no job of ``tenant``; a job
    of another tenant is refused in the same words, so its existence is not revealed. The
    jobs found stay locked FOR KEY SHARE until the enqueue commits (retention skips them)."""
    if not ids:
        return
    found = workflow_store.check_dependencies(cursor, ids)
    unknown = [i for i in ids if i not in found or found[i][0] != tenant]
    if unknown:
        shown = ", ".join(str(i) for i in unknown[:10]) + (", ..." if len(unknown) > 10 else "")
        raise InvalidJob("depends_on", f"no job {shown} of tenant {tenant!r}")


def settle_after_commit(
    using: str, *, ids: Sequence[int] = (), upstreams: Sequence[int] = ()
) -> dict[int, str]:
    """Settle waiting jobs on Django's connection ``using``, once what they wait on has
    committed (``transaction.on_commit``). A failure here is logged, not raised: the
    caller's own work has committed, and maintenance's sweep settles what is left."""
    try:
        return workflow_store.settle_rounds(
            workflow_store.django_atomic(using), ids=ids, upstreams=upstreams
        )
    except Exception:  # the sweep repairs it; the committed enqueue or action stands
        logger.exception(
            "event=settle_failed ids=%s upstreams=%s action=left_to_maintenance",
            ",".join(map(str, list(ids)[:20])),
            ",".join(map(str, list(upstreams)[:20])),
        )
        return {}
