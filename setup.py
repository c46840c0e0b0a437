# Kept for tools and older pips that look for setup.py; pyproject.toml holds the metadata.
from setuptools import setup

setup()
