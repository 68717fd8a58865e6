"""pytest plugin (entry point `pytest11`): SLO-gated replay tests. Never imports locust."""
