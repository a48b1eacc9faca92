"""One sidecar's part in the fleet: presence, claim candidates, orphaned jobs."""
