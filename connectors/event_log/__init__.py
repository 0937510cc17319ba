"""The event-log port and its two implementations; `open_event_log(url)` picks one from a URL."""
