"""pgqueue's benchmarks. Installed as a Django app by bench.settings, for its tasks."""
