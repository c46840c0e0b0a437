"""Other clusters applied on the same balancer, and what they share with this one.

A balancer may carry several clusters, each with its own file, VIPs and
keepalived.  Some of what they set is the kernel's, one per network
namespace: the IPVS timeouts, the connection sync daemon (one master and
one backup) and its settings.  Two clusters that want different values each
put back their own at every apply or keepalived reload, so plan and apply
say so, naming the other cluster.
"""

from lbctl.config.model import Mode

SYNC_DOC = "see \"Several clusters on one balancer\" in docs/keepalived.md"


def clusters_here(cluster, root):
    """The other clusters applied on this balancer, from their saved copies
    (a copy that no longer loads is left out: it changes nothing here)."""
    from lbctl.records.saved import saved_clusters

    return saved_clusters(root, strict=False, leave_out=cluster.name)


def shared_kernel_warnings(cluster, others):
    """One line per clash between `cluster` and the clusters in `others` over
    what the kernel holds once for all of them."""
    warnings = []
    for other in others:
        if cluster.mode == Mode.FAILOVER and other.mode == Mode.FAILOVER:
            warnings.append(
                f"cluster {other.name} is a failover pair on this balancer too: the kernel "
                "runs one connection sync daemon per network namespace, so the connections "
                f"of only one pair survive a failover ({SYNC_DOC})")
        clashes = sorted(name for name in set(cluster.ipvs_timeouts) & set(other.ipvs_timeouts)
                         if cluster.ipvs_timeouts[name] != other.ipvs_timeouts[name])
        if clashes:
            theirs = ", ".join(f"{n} {other.ipvs_timeouts[n]}" for n in clashes)
            ours = ", ".join(f"{n} {cluster.ipvs_timeouts[n]}" for n in clashes)
            warnings.append(
                f"cluster {other.name} applied here sets the IPVS timeouts {theirs}, this file "
                f"{ours}: the kernel holds one set, and each cluster's apply or keepalived "
                f"reload puts back its own ({SYNC_DOC})")
    return warnings
