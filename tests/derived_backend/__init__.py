"""A database backend derived from Django's PostgreSQL one, as instrumented backends
(django-prometheus's, for one) are: pgqueue's engine check must accept it."""
