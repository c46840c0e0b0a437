"""Adapters: each owns one effect on the system and nothing else.

Each has a Protocol here; the real adapters (netlink, iproute2, /proc, files) and the
fakes used by unit tests are both checked against it.
"""
