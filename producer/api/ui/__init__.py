"""The operators' status page (`GET /ui`): server-rendered HTML, a small script and a stylesheet."""
