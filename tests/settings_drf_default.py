"""tests.settings with the project's REST_FRAMEWORK left empty: DRF's own schema class is
the default one (pgqueue's views must not depend on the project choosing drf-spectacular)."""

from tests.settings import *  # noqa: F403

REST_FRAMEWORK: dict = {}
