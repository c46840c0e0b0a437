"""Cluster files for the lab tests, written from Python data so each edit is plain to see."""

import copy

import yaml

WEB_VIP = "192.168.100.10"
DNS_VIP = "192.168.100.11"

BASE = {
    "cluster": "lab",
    "balancers": {"lb1": {"address": "192.168.100.2", "interface": "eth0"}},
    "workers": {
        "pi1": {"address": "192.168.100.3"},
        "pi2": {"address": "192.168.100.4"},
        "pi3": {"address": "192.168.100.6", "weight": 2},
    },
    "services": {
        "web": {"vip": WEB_VIP, "port": 80, "protocol": "tcp", "scheduler": "wrr"},
        "dns": {"vip": DNS_VIP, "port": 53, "protocol": "udp", "scheduler": "rr",
                "workers": ["pi1", "pi2"]},
    },
}

# The failover pair: lb2 joins, the web service is health checked, and VRRP
# runs with the fast settings (a 100 ms advert: failover in about 0.35 s).
PAIR = copy.deepcopy(BASE)
PAIR["balancers"] = {"lb1": {"address": "192.168.100.2", "interface": "eth0", "priority": 150},
                     "lb2": {"address": "192.168.100.5", "interface": "eth0", "priority": 100}}
# Most pair tests fail over and back, so the master takes back over (preempt);
# the default, no preemption, has its own test.
PAIR["vrrp"] = {"advert_interval": "100ms", "preempt": True}
PAIR["services"]["web"]["health"] = {"http": {"path": "/index.html", "status": 200},
                                     "interval": "1s", "timeout": "500ms", "retries": 1, "rise": 3}

# Every node any test uses: the lab's namespaces are built from this.
TOPOLOGY = copy.deepcopy(PAIR)
TOPOLOGY["workers"]["pi4"] = {"address": "192.168.100.7"}


def pair_edited(**changes):
    """PAIR with sections replaced or edited by callables, as edited() does for BASE."""
    spec = copy.deepcopy(PAIR)
    for key, change in changes.items():
        spec[key] = change(spec[key]) if callable(change) else change
    return spec


def steady(spec):
    """`spec` for a test that changes a running pair under load and means to
    fail nothing over and refuse no request.  Apply it to both balancers
    before the load starts.

    - 1 s VRRP adverts: with the pair's 100 ms ones, a keepalived reload on
      the emulated lab's busy CPUs can hold the master's adverts up for three
      of them: the backup takes the VIP for a moment, and a connection begun
      on the master is reset, or its end goes through the backup and the
      master counts it as active for 15 minutes.
    - Two chances for each check: a stall of those CPUs past one check's
      500 ms fails every worker's check at once, and with one chance the VIP
      is left with no real server for the 3 s the rise takes (IPVS then
      refuses each new connection)."""
    spec = copy.deepcopy(spec)
    spec["vrrp"] = {**spec.get("vrrp", {}), "advert_interval": "1s"}
    for service in spec["services"].values():
        if "health" in service:
            service["health"] = {**service["health"], "retries": 2}
    return spec


def steady_pair(**changes):
    """pair_edited(), made steady()."""
    return steady(pair_edited(**changes))


def edited(**changes):
    """BASE with top-level sections replaced or deeply edited by callables."""
    spec = copy.deepcopy(BASE)
    for key, change in changes.items():
        spec[key] = change(spec[key]) if callable(change) else change
    return spec


def write_cluster(path, spec):
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path
