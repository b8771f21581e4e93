"""`tidegate demo`: the whole system on one machine, with a live view and a summary."""
