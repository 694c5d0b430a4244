"""tests.settings without DRF's and drf-spectacular's apps (the packages are installed)."""

from tests import settings as _base
from tests.settings import *  # noqa: F403

INSTALLED_APPS = [a for a in _base.INSTALLED_APPS if a not in ("rest_framework", "drf_spectacular")]
