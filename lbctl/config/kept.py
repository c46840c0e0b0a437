"""Validated models kept in lbctl's cache, so a file is validated once.

The model of a cluster file is the same for as long as the file's bytes are,
and the boot unit, every --all node and every status run read the same file
again: on a Pi, parsing and validating it costs more than the rest of a
status.  A model is found again only by a digest of the file's name and
text and lbctl's code (cache.key), so an edited file or a changed lbctl is
validated anew, and a damaged entry too.  Pickled data is code: the folder
and the entry are trusted as cache.py says.
"""

import os

from lbctl import cache

KEEP = 8  # models; each holds its file's text
LARGEST_KEPT = 8 << 20  # bytes of pickled model


def entry_path(name, text):
    """Where the model of this file is kept; None where there is no cache."""
    directory = cache.folder("clusters")
    if directory is None:
        return None
    return os.path.join(directory, cache.key("cluster", name, text))


def read(path):
    """The model kept at `path`, or None."""
    if path is None:
        return None
    data = cache.load(path, LARGEST_KEPT)
    if data is None:
        return None
    import io
    import pickle

    from lbctl.config import model as classes

    class ModelOnly(pickle.Unpickler):
        """Unpickles the model's own classes and addresses, and nothing else:
        whatever else an entry names is refused before it is called."""

        def find_class(self, module, name):
            found = getattr(classes, name, None) if module == classes.__name__ else None
            if isinstance(found, type) and found.__module__ == classes.__name__:
                return found
            if (module, name) in (("ipaddress", "IPv4Address"), ("ipaddress", "IPv4Network")):
                return super().find_class(module, name)
            raise pickle.UnpicklingError(f"{module}.{name} is no part of a cluster model")

    try:
        model = ModelOnly(io.BytesIO(data)).load()
    except Exception:  # whatever a damaged entry raises: validate anew
        return None
    return model if isinstance(model, classes.Cluster) else None


def keep(path, model):
    if path is None:
        return
    import pickle

    data = pickle.dumps(model, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) <= LARGEST_KEPT:
        cache.store(path, data, keep=KEEP)
