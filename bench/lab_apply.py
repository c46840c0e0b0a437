"""lbctl apply on every node of a benchmark's lab, as a rollout would."""


def apply_everywhere(lab, path, extra=()):
    """Workers first, then balancers; the benchmark stops at the first node that fails."""
    for node, result in lab.apply_all(path, extra=extra).items():
        if result.returncode != 0:
            raise SystemExit(f"bench: apply on {node}: {result.stdout}{result.stderr}")
