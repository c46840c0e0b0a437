"""Cluster files: loading with source positions, validation into the model."""


def load_cluster(path):
    """Read, parse and validate a cluster file; raises ConfigError.  A file
    validated before is read back from lbctl's cache (kept.py), unparsed."""
    from lbctl.config import kept
    from lbctl.config.source import read_source

    name, text = read_source(path)
    entry = kept.entry_path(name, text)
    model = kept.read(entry)
    if model is None:
        from lbctl.config.load import parse_document
        from lbctl.config.validate import validate

        model = validate(parse_document(text, name))
        kept.keep(entry, model)
    return model
