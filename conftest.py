"""attnspec's pytest wiring lives in conformance/plugin.py; this makes every run load it."""

pytest_plugins = ["conformance.plugin"]
