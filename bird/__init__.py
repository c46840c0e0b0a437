"""Shipped with lbctl as package data (see pyproject.toml)."""
