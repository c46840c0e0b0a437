"""The services section: VIPs, ports, schedulers and their flags, the real
servers each one sends to, and their health checks; and the ipvs section."""

import re

from lbctl.config.model import (
    HEALTH_KINDS, HEALTH_PROFILES, IPVS_TIMEOUTS, PROTOCOLS, SCHEDULER_FLAGS, SCHEDULERS,
    HealthCheck, RealServer, VirtualService,
)
from lbctl.config.checker import kind_of

IPVS_KEYS = {"timeouts"}

# keepalived's limit for lvs_timeouts (LVS_MAX_TIMEOUT): 31 days.
MAX_IPVS_TIMEOUT = 86400 * 31

SERVICE_KEYS = {"vip", "port", "protocol", "scheduler", "persistence", "workers", "health",
                "scheduler_flags", "one_packet", "routed"}

HEALTH_KEYS = set(HEALTH_KINDS) | {"interval", "timeout", "retries", "rise", "profile"}

KIND_KEYS = {"http": {"path", "status"}, "tcp": set(), "udp": {"payload", "reply"},
             "exec": {"command"}}

# Strings that reach keepalived.conf: no whitespace, quotes, braces, backslashes,
# or keepalived's comment characters '#' and '!'.
HTTP_PATH_RE = re.compile(r"/[A-Za-z0-9._~%/?&=+:@,-]*")

# UDP probe and reply bytes, as even-length hex (keepalived reads them as hex).
HEX_RE = re.compile(r"(?:[0-9A-Fa-f]{2}){1,255}")

COMMAND_ARG_RE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")


def check_ipvs_timeouts(c, value):
    """{name: whole seconds} of the timeouts under `ipvs: timeouts:`."""
    if c.mapping(value, ("ipvs",), IPVS_KEYS) is None or "timeouts" not in value:
        return {}
    p = ("ipvs", "timeouts")
    spec = c.mapping(value["timeouts"], p, set(IPVS_TIMEOUTS))
    found = {}
    for name in IPVS_TIMEOUTS:
        if spec is None or name not in spec:
            continue
        seconds = c.duration(spec[name], p + (name,), 1, MAX_IPVS_TIMEOUT)
        if seconds is not None and seconds != int(seconds):
            c.error(p + (name,), f"{c.where(p + (name,))}: {spec[name]!r} is not a whole "
                    "number of seconds; IPVS counts its timeouts in seconds")
            seconds = None
        if seconds is not None:
            found[name] = int(seconds)
    return found


def check_services(c, value, workers):
    result = {}
    for name, spec, p in c.entries(value, "services", "service", SERVICE_KEYS, ("vip", "port")):
        # A missing vip or port is reported already; check the rest all the same.
        vip = c.address(spec["vip"], p + ("vip",)) if "vip" in spec else None
        port = c.integer(spec["port"], p + ("port",), 1, 65535, "port") if "port" in spec else None
        protocol = c.choice(spec.get("protocol", "tcp"), p + ("protocol",), PROTOCOLS, "protocol")
        scheduler = c.choice(spec.get("scheduler", "wlc"), p + ("scheduler",), SCHEDULERS, "scheduler")
        # A duration like every other time in the file (300 or 300s); 0 is off.
        persistence = c.whole_seconds(spec.get("persistence", 0), p + ("persistence",), 0,
                                      86400 * 31, "IPVS")
        real_servers = _real_servers(c, spec.get("workers"), p + ("workers",), workers)
        health, health_ok = _health(c, spec.get("health", "none"), p + ("health",), protocol)
        flags = _scheduler_flags(c, spec.get("scheduler_flags", []), p + ("scheduler_flags",),
                                 scheduler)
        one_packet = c.boolean(spec.get("one_packet", False), p + ("one_packet",))
        routed = c.boolean(spec.get("routed", False), p + ("routed",))
        if one_packet and protocol == "tcp":
            c.error(p + ("one_packet",), f"services.{name}.one_packet: one-packet scheduling "
                    "is for UDP services; a TCP connection's packets must all reach the same "
                    "worker")
            one_packet = None
        if real_servers and not any(rs.weight for rs in real_servers):
            c.error(p + ("workers",), f"services.{name}: every worker of the service has weight "
                    "0, so it would take no traffic; give a worker a weight above 0, or remove "
                    "the service (removing a worker from it drains that worker)", key=True)
            real_servers = None
        if None in (vip, port, protocol, scheduler, persistence, real_servers, flags,
                    one_packet, routed) or not health_ok:
            continue
        result[name] = VirtualService(name, vip, port, protocol, scheduler, persistence,
                                      real_servers, health, flags, one_packet, routed)
    return result


def _scheduler_flags(c, value, path, scheduler):
    """The sorted scheduler flag names, or None when one is wrong."""
    if value == []:
        return ()
    known = SCHEDULER_FLAGS.get(scheduler, ())
    if not isinstance(value, list):
        c.error(path, f"{c.where(path)}: expected a list of flag names, found {kind_of(value)}")
        return None
    if scheduler is not None and not known:
        c.error(path, f"{c.where(path)}: scheduler {scheduler} takes no flags; only sh "
                f"({', '.join(SCHEDULER_FLAGS['sh'])}) and mh "
                f"({', '.join(SCHEDULER_FLAGS['mh'])}) do")
        return None
    ok = True
    for i, flag in enumerate(value):
        if flag not in known:
            c.error(path + (i,), f"{c.where(path)}[{i}]: unknown flag {flag!r} for scheduler "
                    f"{scheduler}; known: {', '.join(known)}")
            ok = False
    if ok and len(set(value)) != len(value):
        c.error(path, f"{c.where(path)}: a flag is listed twice")
        ok = False
    return tuple(sorted(value)) if ok else None


def _health(c, value, path, protocol):
    """(HealthCheck or None for `none`, whether it was valid)."""
    if value == "none":
        return None, True
    spec = c.mapping(value, path, HEALTH_KEYS)
    if spec is None:
        return None, False
    kinds = [k for k in HEALTH_KINDS if k in spec]
    if len(kinds) != 1:
        found = ", ".join(kinds) or "none"
        c.error(path, f"{c.where(path)}: give exactly one check kind of "
                f"{', '.join(HEALTH_KINDS)} (or `health: none`); found {found}", key=bool(kinds))
        return None, False
    kind = kinds[0]
    kp = path + (kind,)
    fields = c.mapping(spec[kind] if spec[kind] is not None else {}, kp, KIND_KEYS[kind],
                       required=("command",) if kind == "exec" else ())
    if fields is None:
        return None, False
    fits = {"http": "tcp", "tcp": "tcp", "udp": "udp"}.get(kind)
    ok = True
    if fits is not None and protocol is not None and fits != protocol:
        c.error(kp, f"{c.where(path)}: a {kind} check cannot check a {protocol} service; "
                f"use {'udp' if protocol == 'udp' else 'http or tcp'} or exec", key=True)
        ok = False
    defaults = HealthCheck(kind)
    profile = _profile(c, spec.get("profile", "steady"), path + ("profile",))
    if profile is None:
        return None, False
    values = {
        "interval": c.duration(spec.get("interval", profile["interval"]), path + ("interval",),
                               0.1, 3600),
        "timeout": c.duration(spec.get("timeout", profile["timeout"]), path + ("timeout",),
                              0.1, 300),
        "retries": c.integer(spec.get("retries", profile["retries"]), path + ("retries",), 1, 10,
                             "retries"),
        "rise": c.integer(spec.get("rise", defaults.rise), path + ("rise",), 1, 10, "rise"),
    }
    if None not in (values["interval"], values["timeout"]) \
            and values["timeout"] > values["interval"]:
        # A check still running when the next is due would overlap it, and a
        # dead worker would take longer than `interval` per failed check.
        at = path + ("timeout",) if "timeout" in spec else path + ("interval",)
        c.error(at, f"{c.where(path)}: timeout {values['timeout']:g}s is longer than the "
                f"interval {values['interval']:g}s; a check must end before the next begins")
        ok = False
    if kind == "udp":
        for key in ("payload", "reply"):
            values[key] = _hex(c, fields.get(key, ""), kp + (key,))
        given = [key for key in ("payload", "reply") if key in fields]
        if given and values["rise"] != 1:
            c.error(kp + (given[0],), f"{c.where(kp)}: a udp check with a {given[0]} needs "
                    "rise 1 (keepalived's UDP_CHECK matches replies but has no rise count); "
                    f"found rise {values['rise']}")
            ok = False
    if kind == "http":
        values["path"] = _http_path(c, fields.get("path", defaults.path), kp + ("path",))
        values["status"] = c.integer(fields.get("status", defaults.status), kp + ("status",),
                                     100, 599, "status")
    if kind == "exec":
        # A missing command was reported by mapping() above.
        values["command"] = _command(c, fields["command"], kp + ("command",)) \
            if "command" in fields else None
    if not ok or any(v is None for v in values.values()):
        return None, False
    return HealthCheck(kind, **values), True


def _profile(c, value, path):
    if not isinstance(value, str) or value not in HEALTH_PROFILES:
        c.error(path, f"{c.where(path)}: unknown profile {value!r}; use "
                f"{' or '.join(HEALTH_PROFILES)}")
        return None
    return HEALTH_PROFILES[value]


def _hex(c, value, path):
    if value == "":
        return ""
    if not isinstance(value, str) or not HEX_RE.fullmatch(value):
        c.error(path, f"{c.where(path)}: {value!r} is not usable: give 1 to 255 bytes as "
                "hex digits, two per byte, e.g. 0a1b (no spaces or 0x)")
        return None
    if value.lower().endswith("ff"):
        # keepalived 2.2.7's hex reader (read_hex_str) takes a last byte of
        # 0xff for its end-of-input marker and rejects the whole string.
        c.error(path, f"{c.where(path)}: {value!r} ends in the byte ff, which keepalived "
                "cannot read as the last byte; drop or change it")
        return None
    return value.lower()


def _http_path(c, value, path):
    if not isinstance(value, str) or not HTTP_PATH_RE.fullmatch(value) or len(value) > 1024:
        c.error(path, f"{c.where(path)}: {value!r} is not a usable URL path: it must start "
                "with '/' and use only letters, digits and . _ ~ % / ? & = + : @ , -")
        return None
    return value


def _command(c, value, path):
    if not isinstance(value, list) or not 1 <= len(value) <= 32:
        c.error(path, f"{c.where(path)}: expected a list of 1 to 32 words, the program "
                f"first, found {kind_of(value)}")
        return None
    ok = True
    for i, word in enumerate(value):
        if not isinstance(word, str) or not COMMAND_ARG_RE.fullmatch(word):
            c.error(path + (i,), f"{c.where(path)}[{i}]: {word!r} is not allowed: command "
                    "words are passed to keepalived as they are and may use only letters, "
                    "digits and _ @ % + = : , . / -")
            ok = False
    if ok and not value[0].startswith("/"):
        c.error(path + (0,), f"{c.where(path)}[0]: {value[0]!r} must be an absolute path; "
                "checks run without a shell or a search path")
        ok = False
    return tuple(value) if ok else None


def _real_servers(c, value, path, workers):
    if value is None:
        return tuple(RealServer(w.name, w.address, w.weight) for w in workers.values())
    if isinstance(value, list):
        pairs = [(item, None, path + (i,)) for i, item in enumerate(value)]
    elif isinstance(value, dict):
        pairs = [(k, v, path + (k,)) for k, v in value.items()]
    else:
        c.error(path, f"{c.where(path)}: expected a list of worker names or a mapping of "
                f"worker name to weight, found {kind_of(value)}")
        return None
    if not pairs:
        c.error(path, f"{c.where(path)}: no workers, so the service would take no traffic; "
                "name at least one (leave `workers` out for all of them), or remove the service")
        return None
    result, seen, ok = [], set(), True
    for name, weight, p in pairs:
        if not isinstance(name, str):
            c.error(p, f"{c.where(path)}: YAML reads this as {kind_of(name)} ({name!r}), not as a "
                    "worker name; names are text: put it in quotes", key=isinstance(value, dict))
            ok = False
            continue
        if name not in workers:
            known = ", ".join(sorted(workers)) or "none"
            c.error(p, f"{c.where(path)}: worker {name!r} is not defined under workers "
                    f"(defined: {known})", key=isinstance(value, dict))
            ok = False
            continue
        if name in seen:
            c.error(p, f"{c.where(path)}: worker {name!r} is listed twice")
            ok = False
            continue
        seen.add(name)
        if weight is not None:
            weight = c.integer(weight, p, 0, 65535, "weight")
            if weight is None:
                ok = False
                continue
        worker = workers[name]
        result.append(RealServer(name, worker.address, worker.weight if weight is None else weight))
    return tuple(result) if ok else None
