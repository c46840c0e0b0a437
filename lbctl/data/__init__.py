"""Templates shipped from the top-level sysctl/ and systemd/ folders (see pyproject.toml)."""
