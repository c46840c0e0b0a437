"""How status reads on a balancer and on a worker."""

from lbctl.commands.status import format_status

BALANCER = {
    "services": [{"service": "tcp 192.168.100.10:80", "scheduler": "wrr", "persistence": 0,
                  "connections": 12, "conns_per_s": 2, "in_bytes_per_s": 900, "out_bytes_per_s": 0,
                  "real_servers": [{"address": "192.168.100.3:80", "forward": "route", "weight": 1,
                                    "active": 1, "inactive": 4, "connections": 5}]}],
    "vips_on_lo": [], "arp": {"all": {"arp_ignore": "0", "arp_announce": "0"}},
}
WORKER = {"services": [], "vips_on_lo": ["192.168.100.10"],
          "arp": {"all": {"arp_ignore": "1", "arp_announce": "2"},
                  "eth0": {"arp_ignore": "1", "arp_announce": "2"}}}


def test_a_balancer_shows_services_real_servers_connections_and_rates():
    text = format_status(BALANCER)
    assert "tcp 192.168.100.10:80 wrr  connections 12  2 conn/s  in 900 B/s  out 0 B/s" in text
    assert "-> 192.168.100.3:80" in text and "weight 1" in text and "active 1" in text
    assert "ARP settings" not in text


def test_a_worker_shows_its_vips_and_arp_settings():
    text = format_status(WORKER)
    assert "IPVS services: none" in text
    assert "VIPs on lo: 192.168.100.10" in text
    assert "eth0       arp_ignore=1  arp_announce=2" in text
