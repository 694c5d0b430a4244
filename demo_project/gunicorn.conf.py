"""gunicorn's settings for the demo's API, shared by scripts/demo.py, the Dockerfile and
docker-compose.yml (each gives ``--bind``).

Threads, not sync workers: a sync worker serves one connection at a time, so two of them
were stalled by two clients that opened a connection and sent nothing (a slow or hostile
client, a half-open socket) until gunicorn's timeout. With 2 processes of 8 threads, a few
such connections leave most threads free. In production, put the API behind a proxy that
buffers requests (nginx, a cloud load balancer), as gunicorn's documentation advises.
"""

workers = 2
worker_class = "gthread"
threads = 8
timeout = 30  # seconds a request may hold its thread before its process is restarted
graceful_timeout = 10
keepalive = 5
accesslog = "-"
