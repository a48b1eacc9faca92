"""The command line and the daemon it starts."""
