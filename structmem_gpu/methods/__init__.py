"""Memory methods: each is a list of stages (methods/registry.py) over shared plumbing."""
