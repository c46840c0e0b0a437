"""lbctl: declarative IPVS direct-routing load balancers."""
