"""A valid cluster file of any number of services, for the large-file tests and
bench/validate_large.py."""


def many_services(count):
    lines = ["cluster: big", "network: 10.0.0.0/8", "balancers:", "  lb1: {address: 10.0.0.2}",
             "workers:"]
    lines += [f"  w{i}: {{address: 10.0.0.{i}, weight: {i}}}" for i in range(3, 13)]
    lines.append("services:")
    lines += [f"  s{i}: {{vip: 10.1.{i // 250}.{1 + i % 250}, port: {80 + i % 1000}, "
              f"scheduler: wrr, workers: [w3, w4, w5]}}" for i in range(count)]
    return "\n".join(lines) + "\n"
