"""Driving every node of a cluster from one machine, over the system's OpenSSH."""
