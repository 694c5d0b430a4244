"""Settings of the demo project. Everything that differs between machines comes from the
environment, so the same file serves a laptop, the test suite and the containers."""

from __future__ import annotations

import os
from pathlib import Path

from demo_project import dburl

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("SECRET_KEY", "pgqueue-demo-insecure-key-change-me")
DEBUG = os.environ.get("DEBUG", "0").lower() in ("1", "true", "yes")
ALLOWED_HOSTS = [h for h in os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1").split(",") if h]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "pgqueue",
    "demo_project",  # for its tasks.py
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",  # the admin's static files under gunicorn
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "demo_project.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
WSGI_APPLICATION = "demo_project.wsgi.application"

DATABASES = {
    "default": dburl.parse(
        os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/pgqueue")
    )
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
STATIC_ROOT = Path(os.environ.get("STATIC_ROOT", BASE_DIR / ".static"))

# The API's throttles (failed authentications per address, PGQUEUE["API_RATE_LIMIT"]) count
# in Django's cache: the demo's gunicorn runs several processes, which must share it or
# each would count alone (20 bad keys a minute per process, not per address). A file cache
# is shared by the processes of one host without another server; a deployment on several
# hosts uses Redis, Memcached or the database cache instead.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
        "LOCATION": os.environ.get("CACHE_DIR", str(BASE_DIR / ".cache")),
    }
}

# Every PGQUEUE setting can be given as PGQUEUE_<NAME> in the environment.
PGQUEUE: dict = {}
for _key, _value in os.environ.items():
    if _key.startswith("PGQUEUE_"):
        import json as _json

        try:
            PGQUEUE[_key.removeprefix("PGQUEUE_")] = _json.loads(_value)
        except ValueError:
            PGQUEUE[_key.removeprefix("PGQUEUE_")] = _value

# One line per event in logfmt (key=value), which log shippers parse as it is.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "logfmt": {
            "format": "time=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
            "datefmt": "%Y-%m-%dT%H:%M:%S%z",
        }
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "logfmt"}},
    "loggers": {"pgqueue": {"handlers": ["console"], "level": "INFO"}},
}

# drf-spectacular generates /schema and /docs for pgqueue's API.
REST_FRAMEWORK = {"DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema"}
SPECTACULAR_SETTINGS = {"TITLE": "pgqueue API", "VERSION": "1"}
