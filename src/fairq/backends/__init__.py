"""Storage engines behind the one seam in :mod:`fairq.backends.base`.

Each backend module is the only place its driver is imported.
"""
