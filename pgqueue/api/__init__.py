"""The HTTP API: DRF views over the service layer. Mounted by including ``pgqueue.urls``."""
