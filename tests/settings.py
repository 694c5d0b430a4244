"""Test settings: the demo project's, plus the test tasks app."""

from demo_project.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "tests.taskapp"]  # noqa: F405
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
LOGGING = {"version": 1, "disable_existing_loggers": False}
# The suite decides its own PGQUEUE settings; none leak in from the environment.
PGQUEUE: dict = {}
