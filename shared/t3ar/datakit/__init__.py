"""datakit."""
