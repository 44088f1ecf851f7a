"""gunicorn settings for the console: `gunicorn project.wsgi` reads this file from the cwd.

Every value comes from the environment so one image serves every deployment.
"""
import multiprocessing
import os

bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000")
# Two workers per core plus one: the console is I/O-bound (database reads), not CPU-bound.
workers = int(os.environ.get("GUNICORN_WORKERS", multiprocessing.cpu_count() * 2 + 1))
# A page that takes longer than this is stuck, not slow: the worker is restarted.
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "30"))
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "30"))
accesslog = os.environ.get("GUNICORN_ACCESS_LOG", "-")
errorlog = "-"
