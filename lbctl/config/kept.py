"""Validated models kept in lbctl's cache, so a file is validated once.

The model of a cluster file is the same for as long as the file's bytes are,
and the boot unit, every --all node and every status run read the same file
again: on a Pi, parsing and validating it costs more than the rest of a
status.  A model is found again only by a digest of the file's name and
text, lbctl's version, the Python that pickled it and the code that built it
(the config package's files, by size and time), so an edited file or a
changed lbctl is validated anew.  The entry carries the digest of its own
bytes: a damaged one is validated anew too.  The folder is trusted as
cache.py says; pickled data from it is code, as compiled templates are.
"""

import hashlib
import os
import sys

from lbctl import __version__, cache

KEEP = 8  # models; each holds its file's text
LARGEST_KEPT = 8 << 20  # bytes of pickled model


def _code_stamp():
    here = os.path.dirname(os.path.abspath(__file__))
    stamps = []
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            info = os.stat(os.path.join(here, name))
            stamps.append(f"{name}:{info.st_size}:{info.st_mtime_ns}")
    return ",".join(stamps)


def entry_path(name, text):
    """Where the model of this file is kept; None where there is no cache."""
    directory = cache.folder("clusters")
    if directory is None:
        return None
    key = "\0".join((__version__, sys.version, _code_stamp(), name, text))
    return os.path.join(directory, hashlib.sha256(key.encode()).hexdigest())


def read(path):
    """The model kept at `path`, or None."""
    if path is None:
        return None
    data = cache.load(path, LARGEST_KEPT)
    if data is None:
        return None
    try:
        import pickle

        from lbctl.config.model import Cluster

        model = pickle.loads(data)
    except Exception:  # whatever a damaged entry raises: validate anew
        return None
    return model if isinstance(model, Cluster) else None


def keep(path, model):
    if path is None:
        return
    import pickle

    data = pickle.dumps(model, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) <= LARGEST_KEPT:
        cache.store(path, data, keep=KEEP)
