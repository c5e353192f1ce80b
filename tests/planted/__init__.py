"""Planted-bug and misbehaving implementations that the project's own tests run the suite against.

Each one is something the suite must reject; none of them is importable as a built-in.
"""
