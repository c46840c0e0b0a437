"""Templates shipped from the top-level sysctl/, systemd/, keepalived/, bird/
and examples/ folders, each linked in here (see pyproject.toml)."""
