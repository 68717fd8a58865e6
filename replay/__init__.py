"""The act: Locust open-loop runner, streaming client, prompts, recorder, CLI, pytest plugin.

Importing this package must stay cheap and must never import locust (which monkey-patches
the process with gevent): only the runner process does that.
"""
__version__ = "0.1.0"
