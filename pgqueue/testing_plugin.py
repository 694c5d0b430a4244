"""pgqueue's pytest plugin: the ``pgqueue_jobs`` fixture (``pgqueue.testing``'s helpers).

pytest loads it by itself wherever pgqueue is installed (the ``pytest11`` entry point
``pgqueue``), in every project, with or without pytest-django and before Django's settings
are configured. So it imports no more than the ``pgqueue`` package itself (which needs no
settings) until a test asks for the fixture, and it adds nothing else: no autouse fixture,
hook, option or marker. ``-p no:pgqueue`` turns it off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pgqueue.testing import PgQueueJobs


@pytest.fixture
def pgqueue_jobs(request: pytest.FixtureRequest) -> PgQueueJobs:
    """Run and inspect the jobs of this test: ``pgqueue_jobs.run()`` (``run_jobs``),
    ``.enqueued(...)``, ``.assert_enqueued(...)`` and ``.assert_not_enqueued(...)``.

    Gives the test database access through pytest-django's ``db`` fixture, which follows
    the test's ``django_db`` mark: in the test's transaction by default, committed with
    ``transaction=True``. Jobs in another database (``PGQUEUE["DATABASE"]``) need that alias
    in the mark's ``databases``.
    """
    try:
        request.getfixturevalue("db")
    except pytest.FixtureLookupError:
        missing = True
    else:
        missing = False
    if missing:  # failed outside the except block: the lookup's error is noise
        pytest.fail(
            "the pgqueue_jobs fixture needs pytest-django (its db fixture): "
            "pip install pytest-django",
            pytrace=False,
        )
    from pgqueue.testing import PgQueueJobs

    return PgQueueJobs()
