"""Benchmark settings: the demo project's, plus the bench tasks, on the bench database."""

from demo_project.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "bench"]  # noqa: F405
LOGGING = {"version": 1, "disable_existing_loggers": False}
