"""Memory methods: each is a list of stages (conf/method/*.yaml, resolved by methods/registry.py) over shared plumbing."""
