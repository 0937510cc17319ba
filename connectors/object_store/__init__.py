"""The object-store port and its two implementations; `open_object_store(url, ...)` picks one from a URL."""
