"""One module per command; cli.py only parses arguments and calls these."""
