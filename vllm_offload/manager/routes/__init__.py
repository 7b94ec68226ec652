"""The manager's routes, one router a concern: the session (login, page, static files),
the status (the page's polls, metrics, logs), the config (read, preview, save), the
service (start, stop, restart, the disk tier, the probe) and, with several models, the
models (bring one in, put one away)."""
