"""Cluster files: loading with source positions, validation into the model."""


def load_cluster(path, fresh=False):
    """Read, parse and validate a cluster file; raises ConfigError.  A file
    validated before is read back from lbctl's cache (kept.py), unparsed,
    unless `fresh` (lbctl validate: the operator's own check).

    Validation reads nothing but the file's name and text, so its model can
    be kept; a check of this host belongs in plan, not in the validator."""
    from lbctl.config import kept
    from lbctl.config.source import read_source

    name, text = read_source(path)
    entry = kept.entry_path(name, text)
    model = None if fresh else kept.read(entry)
    if model is None:
        from lbctl.config.load import parse_document
        from lbctl.config.validate import validate

        model = validate(parse_document(text, name))
        kept.keep(entry, model)
    return model
