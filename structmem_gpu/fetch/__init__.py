"""What `python jobs/data.py` fetches and checks: benchmark files (datasets.py), the models a
job loads (models.py), the pinned official checkouts (official.py), and the caches it maintains
(cache_admin.py). jobs/data.py parses the command line and calls these."""
