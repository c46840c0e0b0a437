"""bird.conf for a balancer in mode ecmp: a BGP session to the router that
offers it every VIP as a /32, each held by a static protocol of its own."""

from lbctl.render.templates import render

BIRD_TEMPLATE = "bird.conf.j2"


def vip_protocol(vip):
    """The name of the static protocol that holds `vip`: `birdc disable` takes it."""
    return "lbctl_vip_" + str(vip).replace(".", "_")


def render_bird_conf(cluster, node, interface):
    """`interface`: the balancer's LAN interface, as apply found it (BFD runs there)."""
    balancer = cluster.balancers[node]
    bgp = cluster.bgp
    return render("bird", BIRD_TEMPLATE, cluster=cluster.name, node=node,
                  address=balancer.address, interface=interface, bgp=bgp,
                  bfd_interval_ms=None if bgp.bfd is None else round(bgp.bfd.interval * 1000),
                  vips=[(vip, vip_protocol(vip)) for vip in cluster.vips])
