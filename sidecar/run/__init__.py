"""One job's life: claim, lease, trigger, record, retries and lost runs."""
