"""A balancer's BIRD in mode ecmp: its bird.conf, a BGP session to the router
that offers it the VIPs this balancer can serve now, each as a /32, and the
map keepalived's hook decides that from."""

from lbctl.render.templates import render

BIRD_TEMPLATE = "bird.conf.j2"
BIRD_UNIT_TEMPLATE = "lbctl-bird.service"


def render_bird_conf(cluster, node, interface, layout):
    """`interface`: the balancer's LAN interface, as apply found it (BFD runs
    there).  The VIPs offered are the files in the layout's announce folder."""
    balancer = cluster.balancers[node]
    bgp = cluster.bgp
    return render("bird", BIRD_TEMPLATE, cluster=cluster.name, node=node,
                  address=balancer.address, interface=interface, bgp=bgp,
                  bfd_interval_ms=None if bgp.bfd is None else round(bgp.bfd.interval * 1000),
                  announce_dir=layout.real(layout.announce_dir))


def announce_key(svc):
    """A service as keepalived tells it apart (protocol, VIP, port), for the
    announce hook's records: a service renamed in the file stays the same
    virtual server in keepalived, which reports no new quorum for it."""
    return f"{svc.protocol}-{svc.vip}-{svc.port}"


def render_announce_map(cluster):
    """Each VIP and the services on it, a line each ("VIP SERVICE..."): the
    hook offers a VIP only while all of them have a healthy worker."""
    lines = []
    for vip in cluster.vips:
        keys = sorted(announce_key(s) for s in cluster.services.values() if s.vip == vip)
        lines.append(" ".join([str(vip), *keys]))
    return "".join(f"{line}\n" for line in lines)


def render_announce_slots(slots):
    """The drained real servers that have slots in the other balancers' mh
    tables (mode ecmp has mh alone), and the weight the kernel filled them
    by, a line each ("SERVICE ADDRESS:PORT:WEIGHT").  keepalived adds a
    drained server at weight 0, and mh fills its table by the last weight
    above 0 a server had: on a balancer whose keepalived starts while a worker is drained,
    the announce hook sets that weight and 0 again just before the balancer
    offers a VIP.  `slots`: drains.slot_weights(), whose weights are above 0."""
    # No header: the hook waits for the slots' lock only when there are any.
    return "".join(sorted(f"{announce_key(key.service)} {key.address}:{key.port}:{weight}\n"
                          for key, weight in slots.items()))


# The system user Debian's bird2 package makes.  BIRD drops to it once its
# control socket is open (keeping only the network capabilities BGP and BFD
# need), so a flaw in its BGP parser is not root's.
BIRD_USER = "bird"


def bird_argv(layout, bird="/usr/sbin/bird"):
    """BIRD in the foreground, with this cluster's config, socket and pid file,
    run as BIRD_USER."""
    return [bird, "-f", "-u", BIRD_USER, "-g", BIRD_USER, "-c", layout.real(layout.bird_conf),
            "-s", layout.real(layout.bird_socket), "-P", layout.real(layout.pid_file("bird"))]


def render_bird_unit(layout, bird="/usr/sbin/bird", birdc="/usr/sbin/birdc"):
    return render("systemd", BIRD_UNIT_TEMPLATE, cluster=layout.cluster,
                  keepalived_unit=layout.unit, argv=" ".join(bird_argv(layout, bird)),
                  announce_dir=layout.real(layout.announce_dir), birdc=birdc,
                  socket=layout.real(layout.bird_socket), user=BIRD_USER,
                  pid_file=layout.real(layout.pid_file("bird")))
