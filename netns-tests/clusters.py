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

# Every node any test uses: the lab's namespaces are built from this.
TOPOLOGY = copy.deepcopy(BASE)
TOPOLOGY["workers"]["pi4"] = {"address": "192.168.100.7"}


def edited(**changes):
    """BASE with top-level sections replaced or deeply edited by callables."""
    spec = copy.deepcopy(BASE)
    for key, change in changes.items():
        spec[key] = change(spec[key]) if callable(change) else change
    return spec


def write_cluster(path, spec):
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path
