"""Configuration: typed settings, their checks, and which keys change a result."""
