"""bird.conf for a balancer in mode ecmp: a BGP session to the router that
offers it the VIPs this balancer can serve now, each as a /32."""

from lbctl.render.templates import render

BIRD_TEMPLATE = "bird.conf.j2"


def render_bird_conf(cluster, node, interface, announced=()):
    """`interface`: the balancer's LAN interface, as apply found it (BFD runs
    there).  `announced`: the VIPs to offer the router; the config is closed
    by default, so a BIRD started from it before health is known offers none."""
    balancer = cluster.balancers[node]
    bgp = cluster.bgp
    unknown = set(announced) - set(cluster.vips)
    if unknown:
        raise ValueError(f"not VIPs of cluster {cluster.name}: {sorted(map(str, unknown))}")
    return render("bird", BIRD_TEMPLATE, cluster=cluster.name, node=node,
                  address=balancer.address, interface=interface, bgp=bgp,
                  bfd_interval_ms=None if bgp.bfd is None else round(bgp.bfd.interval * 1000),
                  vips=cluster.vips, announced=[str(v) for v in sorted(set(announced))])
