"""Tools over recorded history: archive, replay, audit, export, importers."""
