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
