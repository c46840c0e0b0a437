"""`lbctl lab ...`: the cluster in network namespaces on this machine."""

import os
import sys


def example(name):
    """The path of one of the example cluster files shipped with lbctl."""
    from importlib.resources import files

    return str(files("lbctl.data.examples").joinpath(name))


def default_example():
    """The reference Pi cluster: a failover pair in front of three workers."""
    return example("pi-pair.yaml")


def run(args, out):
    if args.lab_command == "demo":
        cluster_file = os.path.abspath(args.file or default_example())
        from lbctl.config import load_cluster

        load_cluster(cluster_file)  # report a bad file before booting anything
        if os.geteuid() != 0:
            from lbctl.errors import LabError

            raise LabError("lab demo: needs root to create network namespaces")
        from lbctl.lab import vm

        if os.environ.get("LBCTL_LAB_VM") == "1" or vm.host_has_ipvs():
            from lbctl.lab.demo import demo

            return demo(cluster_file, out, requests=args.requests)
        out.flush()
        return vm.run_with_ipvs([sys.executable, "-m", "lbctl", "lab", "demo", cluster_file,
                                 "--requests", str(args.requests)])
    return 2
