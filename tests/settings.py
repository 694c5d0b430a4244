"""Test settings: the demo project's, plus the test tasks app."""

from demo_project.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.taskapp"]  # noqa: F405
# WhiteNoise serves the demo's collected static files; tests serve none (and a fresh clone
# has no collected files, which WhiteNoise would warn about).
MIDDLEWARE = [m for m in MIDDLEWARE if not m.startswith("whitenoise.")]  # noqa: F405
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LOGGING = {"version": 1, "disable_existing_loggers": False}
# The suite decides its own PGQUEUE settings; none leak in from the environment.
PGQUEUE: dict = {}
# One test process: its own memory is cache enough (the demo shares a file cache between
# gunicorn's processes), and nothing is left on disk.
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# A second alias on the same server, its own database (<default's name>_q), for the tests
# of PGQUEUE["DATABASE"] (tests/test_queue_database.py): pytest-django creates its test
# database only when a test asks for it (databases=[..., "queue"]). The worker subprocesses
# of those tests get its test database as QUEUE_DATABASE_URL. The router has no opinion
# while PGQUEUE["DATABASE"] is "default", as it is for the rest of the suite.
DATABASES["queue"] = (  # noqa: F405
    dburl.parse(os.environ["QUEUE_DATABASE_URL"])  # noqa: F405
    if os.environ.get("QUEUE_DATABASE_URL")  # noqa: F405
    else {**DATABASES["default"], "NAME": DATABASES["default"]["NAME"] + "_q"}  # noqa: F405
)
DATABASE_ROUTERS = ["pgqueue.router.QueueRouter"]
