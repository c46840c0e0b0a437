"""Small builders shared by the unit tests."""

from lbctl.config.load import parse_document
from lbctl.config.validate import validate

PI_SINGLE = """\
cluster: pi-web
balancers:
  lb1: {address: 192.168.100.2, interface: eth0}
workers:
  pi1: {address: 192.168.100.3}
  pi2: {address: 192.168.100.4}
  pi3: {address: 192.168.100.6, weight: 2}
services:
  web: {vip: 192.168.100.10, port: 80, scheduler: wrr}
  dns: {vip: 192.168.100.11, port: 53, protocol: udp, scheduler: rr, workers: [pi1, pi2]}
"""


def cluster_from(text=PI_SINGLE, path="cluster.yaml"):
    return validate(parse_document(text, path))
