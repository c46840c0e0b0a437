"""What apply does: the state the file wants (desired.py), the state the node
has (observe.py), the plan between them and carrying it out; node.py gathers
them for one node."""
