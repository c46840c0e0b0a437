"""Text for the files lbctl writes, rendered from templates kept in the repo."""
