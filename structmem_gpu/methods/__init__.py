"""Memory methods: each is a list of stages over shared plumbing (conf/method/*.yaml, resolved
by methods/registry.py)."""
