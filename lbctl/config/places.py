"""Places in a validated cluster file, for problems found after validation
(against this node's kernel): the model keeps the file's text, not its marks,
so the text is parsed again, on that error's path only."""


def worker_diagnostic(cluster, service, worker, message):
    """A Diagnostic at the place the file names `worker` for `service`: in
    the service's own `workers`, else under the top level's `workers`."""
    from lbctl.config.load import parse_document

    doc = parse_document(cluster.text, cluster.source)
    spec = ((doc.data or {}).get("services") or {}).get(service) or {}
    listed = spec.get("workers") if isinstance(spec, dict) else None
    if isinstance(listed, list) and worker in listed:
        return doc.diagnostic(("services", service, "workers", listed.index(worker)), message)
    if isinstance(listed, dict):
        return doc.diagnostic(("services", service, "workers", worker), message, key=True)
    return doc.diagnostic(("workers", worker), message, key=True)
