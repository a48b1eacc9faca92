"""What the sidecar tells operators: metrics, logs, run spans."""
