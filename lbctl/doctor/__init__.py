"""lbctl doctor: the mistakes that break direct routing, found where they show.

`facts` reads this host (addresses, links, sysctls, listeners, modules);
`local` turns the facts into findings for the node this host is; `wire`
sends ARP and TCP probes with scapy and reads who answers; `report` prints
the findings.  The checks are pure functions of what was read or heard, so
the unit tests give them facts and answers directly.
"""
