"""Event schemas of orl: the Avro `.avsc` files, the codec, deterministic ids and the topic catalog.

This package imports nothing else of orl; every other package depends on it.
"""
