"""Cluster files: loading with source positions, validation into the model."""

from lbctl.config.load import load_document
from lbctl.config.validate import validate


def load_cluster(path):
    """Read, parse and validate a cluster file; raises ConfigError."""
    return validate(load_document(path))
