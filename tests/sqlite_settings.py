"""The test settings on SQLite: what a new project's default DATABASES looks like.

tests/test_checks.py runs manage.py with these to see what pgqueue says on a database it
cannot use. Nothing connects: the commands must refuse before.
"""

from tests.settings import *  # noqa: F403

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
