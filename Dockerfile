# The demo project's image: the API (gunicorn) and the worker run from it.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DJANGO_SETTINGS_MODULE=demo_project.settings \
    STATIC_ROOT=/app/static \
    CACHE_DIR=/tmp/pgqueue-cache

WORKDIR /app
RUN useradd --create-home --uid 10001 pgqueue

COPY pyproject.toml README.md ./
COPY pgqueue ./pgqueue
# The demo serves the HTTP API: pgqueue with its `api` extra.
RUN pip install --no-cache-dir ".[api]" "gunicorn>=22" "whitenoise>=6.6"

COPY manage.py ./
COPY demo_project ./demo_project
RUN python manage.py collectstatic --no-input -v 0

USER pgqueue
EXPOSE 8000
CMD ["gunicorn", "demo_project.wsgi", "--config", "demo_project/gunicorn.conf.py", "--bind", "0.0.0.0:8000"]
