"""lbctl: declarative IPVS direct-routing load balancers."""

# One place for the version: packaging reads it (pyproject.toml), `lbctl
# --version` prints it, and `--all` compares it with each node's.
__version__ = "0.2.0"
