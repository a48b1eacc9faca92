"""What follows a run: notices, pings, health events, request signing."""
