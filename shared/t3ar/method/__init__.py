"""method."""
